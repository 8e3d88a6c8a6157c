# SPDX-License-Identifier: BSD-3-Clause
"""Ghost-cell exchange between blocks (miniAMR's comm.c, --code 0).

Three phases, x then y then z (rotated per stage with --permute).  In each
phase a rank posts one nonblocking receive and one nonblocking send per
partner rank (all faces to/from that rank bundled into one buffer, tag =
direction), does the copies between its own blocks and the reflective
boundary copies while the messages fly, then waits and unpacks.

Faces between levels follow miniAMR: a coarse ghost cell receives the sum
of the 2x2 fine face cells next to it; each fine ghost cell receives 1/4
of the coarse face cell next to it (values are amounts per cell).  The
sender does the arithmetic (sum, or /4 of one value per coarse cell that
the receiver spreads over 2x2 ghosts), in the same order as the on-rank
copy does, so results do not depend on which rank holds which block.

With the 27-point stencil, same-level faces and boundary faces also carry
the ghost lines of the phases already done, which fills edge and corner
ghosts; faces between levels do not (as miniAMR: the 27-point stencil does
not conserve the sum across levels).

The plan (flat indices into ``A[var-group].reshape(nvg, -1)``) is rebuilt
from the replicated directory after every mesh change.  Links between a
pair of ranks are ordered by (type, receiving block, face, sending block)
on both sides, so no index lists are exchanged.
"""
import functools

import numpy as np
from mpi4py import MPI

from .mesh import BOUNDARY, COARSER, FINER, SAME, TANGENTS

# link types, named from the receiving block's side
T_SAME, T_F2C, T_C2F = 0, 1, 2


def _plane(stride, d, idx, r1, r2):
    """Offsets of plane IDX of dimension D over tangential ranges R1, R2
    (the two other dimensions in increasing order), R1-major."""
    t1, t2 = TANGENTS[d]
    return (idx * stride[d] + r1[:, None] * stride[t1]
            + r2[None, :] * stride[t2]).ravel().astype(np.int64)


class _Patterns:
    """Cell offsets (within one block) of every face operation."""

    def __init__(self, n3, stencil):
        N = np.array(n3)
        X, Y, Z = N + 2
        self.BS = int(X * Y * Z)
        stride = (int(Y * Z), int(Z), 1)
        H = N // 2
        self.same_dst, self.same_src, self.bc_src = {}, {}, {}
        self.f2c_dst, self.f2c_src4 = {}, {}
        self.c2f_dst, self.c2f_src, self.c2f_rep, self.qoff = {}, {}, {}, {}
        ext = stencil == 27
        for rf in range(6):
            d, s = rf >> 1, rf & 1
            t1, t2 = TANGENTS[d]
            g = 0 if s == 0 else N[d] + 1          # receiver's ghost plane
            h = N[d] if s == 0 else 1              # sender's plane next to it
            inner = 1 if s == 0 else N[d]          # boundary: own next plane
            plane = functools.partial(_plane, stride, d)
            r1, r2 = (np.arange(0, N[t] + 2) if ext and t < d
                      else np.arange(1, N[t] + 1) for t in (t1, t2))
            self.same_dst[rf] = plane(g, r1, r2)
            self.same_src[rf] = plane(h, r1, r2)
            self.bc_src[rf] = plane(inner, r1, r2)
            f1, f2 = np.arange(1, N[t1] + 1), np.arange(1, N[t2] + 1)
            q1, q2 = np.arange(1, H[t1] + 1), np.arange(1, H[t2] + 1)
            self.f2c_dst[rf] = plane(g, q1, q2)
            self.f2c_src4[rf] = np.stack([
                plane(h, 2 * q1 - 1 + e1, 2 * q2 - 1 + e2)
                for e1, e2 in ((0, 0), (0, 1), (1, 0), (1, 1))])   # (4, k)
            self.c2f_dst[rf] = plane(g, f1, f2)
            self.c2f_src[rf] = plane(h, q1, q2)
            self.c2f_rep[rf] = (((f1 - 1) // 2)[:, None] * H[t2]
                                + ((f2 - 1) // 2)[None, :]).ravel()
            self.qoff[rf] = np.array(
                [(q >> 1) * H[t1] * stride[t1] + (q & 1) * H[t2] * stride[t2]
                 for q in range(4)], dtype=np.int64)


class _Partner:
    __slots__ = (
        "r_bsel",
        "r_dst",
        "rank",
        "rlen",
        "s_copy",
        "s_quarter",
        "s_sum",
        "slen",
    )


class _Phase:
    __slots__ = (
        "c2f_dst",
        "c2f_src",
        "copy_dst",
        "copy_src",
        "f2c_dst",
        "f2c_src",
        "n_local",
        "n_remote",
        "partners",
    )


def _cat(chunks):
    if not chunks:
        return np.zeros(0, np.int64)
    return np.concatenate(chunks)


class GhostExchange:
    """Plan and perform the ghost-cell exchange of one rank."""

    def __init__(self, n3, stencil, p2p):
        self.pat = _Patterns(n3, stencil)
        self.p2p = p2p
        self.phases = []
        self.links = {}

    # -- planning -------------------------------------------------------------
    def build(self, mesh, rank):
        P = self.pat
        BS = P.BS
        own = mesh.own(rank)
        n = len(mesh)
        slot = np.full(n, -1, np.int64)
        slot[own] = np.arange(len(own))
        owner = mesh.owner
        loc = [{k: [] for k in ("copy_dst", "copy_src", "f2c_dst",
                                "f2c_src", "c2f_dst", "c2f_src")}
               for _ in range(3)]
        # remote[d][(partner, "s"|"r", type)] -> list of (keys, mats[, pat])
        remote = [{} for _ in range(3)]
        stats = {"local": 0, "remote": 0, "boundary": 0, "interlevel": 0,
                 "interlevel_remote": 0}

        def idx(slots, qoff, pat):
            return (slots[:, None] * BS + np.asarray(qoff)[..., None]
                    + pat[None, :]) if len(slots) else \
                np.zeros((0, len(pat)), np.int64)

        def idx4(slots, pat4):          # -> (m, 4, k)
            return slots[:, None, None] * BS + pat4[None, :, :]

        def key(typ, recv, rf, send):
            return ((typ * n + recv) * 6 + rf) * n + send

        def add_remote(d, partners, side, typ, keys, mats):
            for p in np.unique(partners).tolist():
                sel = partners == p
                remote[d].setdefault((p, side, typ), []).append(
                    (keys[sel], mats[sel]))

        for f in range(6):
            d = f >> 1
            t1, t2 = TANGENTS[d]
            fo = f ^ 1
            L = loc[d]
            kind, nbr = mesh.face_neighbors(own, f)
            # domain boundary: reflect
            r = np.flatnonzero(kind == BOUNDARY)
            L["copy_dst"].append(idx(r, 0, P.same_dst[f]).ravel())
            L["copy_src"].append(idx(r, 0, P.bc_src[f]).ravel())
            stats["boundary"] += len(r)
            # same level
            r = np.flatnonzero(kind == SAME)
            nb = nbr[r, 0]
            here = owner[nb] == rank
            L["copy_dst"].append(idx(r[here], 0, P.same_dst[f]).ravel())
            L["copy_src"].append(idx(slot[nb[here]], 0, P.same_src[f]).ravel())
            rr, nn = r[~here], nb[~here]
            pp = owner[nn]
            add_remote(d, pp, "r", T_SAME, key(T_SAME, own[rr], f, nn),
                       idx(rr, 0, P.same_dst[f]))
            add_remote(d, pp, "s", T_SAME, key(T_SAME, nn, fo, own[rr]),
                       idx(rr, 0, P.same_src[fo]))
            stats["local"] += int(here.sum())
            stats["remote"] += len(rr)
            # coarser neighbour: this block is the fine side
            r = np.flatnonzero(kind == COARSER)
            nb = nbr[r, 0]
            myq = (mesh.pos[own[r], t1] & 1) * 2 + (mesh.pos[own[r], t2] & 1)
            here = owner[nb] == rank
            L["c2f_dst"].append(idx(r[here], 0, P.c2f_dst[f]).ravel())
            L["c2f_src"].append(idx(slot[nb[here]], P.qoff[f][myq[here]],
                                    P.c2f_src[f][P.c2f_rep[f]]).ravel())
            rr, nn = r[~here], nb[~here]
            pp = owner[nn]
            add_remote(d, pp, "r", T_C2F, key(T_C2F, own[rr], f, nn),
                       idx(rr, 0, P.c2f_dst[f]))
            add_remote(d, pp, "s", T_F2C, key(T_F2C, nn, fo, own[rr]),
                       idx4(rr, P.f2c_src4[fo]))
            stats["interlevel"] += len(r)
            stats["interlevel_remote"] += len(rr)
            stats["local"] += int(here.sum())
            stats["remote"] += len(rr)
            # finer neighbours: this block is the coarse side, 4 quarters
            r = np.flatnonzero(kind == FINER)
            for q in range(4):
                nb = nbr[r, q]
                here = owner[nb] == rank
                L["f2c_dst"].append(idx(r[here], P.qoff[f][q],
                                        P.f2c_dst[f]).ravel())
                L["f2c_src"].append(idx4(slot[nb[here]], P.f2c_src4[f]))
                rr, nn = r[~here], nb[~here]
                pp = owner[nn]
                add_remote(d, pp, "r", T_F2C, key(T_F2C, own[rr], f, nn),
                           idx(rr, P.qoff[f][q], P.f2c_dst[f]))
                add_remote(d, pp, "s", T_C2F, key(T_C2F, nn, fo, own[rr]),
                           idx(rr, P.qoff[fo][q], P.c2f_src[fo]))
                stats["interlevel"] += len(r)
                stats["interlevel_remote"] += len(rr)
                stats["local"] += int(here.sum())
                stats["remote"] += len(rr)

        self.phases = []
        for d in range(3):
            L = loc[d]
            ph = _Phase()
            ph.copy_dst = _cat(L["copy_dst"])
            ph.copy_src = _cat(L["copy_src"])
            ph.c2f_dst = _cat(L["c2f_dst"])
            ph.c2f_src = _cat(L["c2f_src"])
            ph.f2c_dst = _cat(L["f2c_dst"])
            f2c = [m for m in L["f2c_src"] if len(m)]
            ph.f2c_src = (np.concatenate(f2c).transpose(1, 0, 2).ravel()
                          if f2c else np.zeros(0, np.int64))
            ph.partners = []
            for p in sorted({k[0] for k in remote[d]}):
                ph.partners.append(self._partner(p, remote[d], P, d))
            ph.n_local = len(ph.copy_dst) + len(ph.c2f_dst) + len(ph.f2c_dst)
            ph.n_remote = sum(pr.rlen for pr in ph.partners)
            self.phases.append(ph)
        self.links = stats

    @staticmethod
    def _sorted(chunks):
        keys = np.concatenate([c[0] for c in chunks])
        mats = np.concatenate([c[1] for c in chunks])
        order = np.argsort(keys, kind="stable")
        return mats[order]

    def _partner(self, p, rem, P, d):
        pr = _Partner()
        pr.rank = p
        get = rem.get
        # send side: [same copies][sums of 4 fine][coarse values / 4]
        c = get((p, "s", T_SAME))
        pr.s_copy = self._sorted(c).ravel() if c else np.zeros(0, np.int64)
        c = get((p, "s", T_F2C))
        if c:
            m = self._sorted(c)                        # (L, 4, k)
            pr.s_sum = m.transpose(1, 0, 2).ravel()    # (4, L*k)
        else:
            pr.s_sum = np.zeros(0, np.int64)
        c = get((p, "s", T_C2F))
        pr.s_quarter = self._sorted(c).ravel() if c else np.zeros(0, np.int64)
        pr.slen = len(pr.s_copy) + len(pr.s_sum) // 4 + len(pr.s_quarter)
        # receive side, same order: copies, sums (copied), spread quarters
        dst, bsel, base = [], [], 0
        for typ in (T_SAME, T_F2C):
            c = get((p, "r", typ))
            if c:
                m = self._sorted(c).ravel()
                dst.append(m)
                bsel.append(base + np.arange(len(m)))
                base += len(m)
        c = get((p, "r", T_C2F))
        if c:
            m = self._sorted(c)                        # (L, N1*N2)
            rep = P.c2f_rep[2 * d]
            k = int(rep.max()) + 1
            dst.append(m.ravel())
            bsel.append((base + np.arange(len(m))[:, None] * k
                         + rep[None, :]).ravel())
            base += len(m) * k
        pr.r_dst = _cat(dst)
        pr.r_bsel = _cat(bsel)
        pr.rlen = base
        return pr

    def partner_counts(self):
        """miniAMR's comm partner statistics: x, y, z, total, unique."""
        per = [len(ph.partners) for ph in self.phases]
        uniq = len({pr.rank for ph in self.phases for pr in ph.partners})
        return per + [sum(per), uniq]

    # -- exchange ---------------------------------------------------------------
    def exchange(self, A, s, e, order=(0, 1, 2)):
        """Fill the ghost cells of variables S..E-1 of every local block."""
        nvg = e - s
        V = A[s:e].reshape(nvg, -1)
        p2p = self.p2p
        for d in order:
            ph = self.phases[d]
            rreq, rbuf = [], []
            for pr in ph.partners:
                if pr.rlen:
                    b = np.empty((nvg, pr.rlen))
                    rbuf.append(b)
                    rreq.append(p2p.Irecv(b, source=pr.rank, tag=d))
            sreq, sbuf = [], []
            for pr in ph.partners:
                if not pr.slen:
                    continue
                parts = []
                if len(pr.s_copy):
                    parts.append(V[:, pr.s_copy])
                if len(pr.s_sum):
                    g = V[:, pr.s_sum].reshape(nvg, 4, -1)
                    t = g[:, 0] + g[:, 1]
                    t += g[:, 2]
                    t += g[:, 3]
                    parts.append(t)
                if len(pr.s_quarter):
                    parts.append(V[:, pr.s_quarter] * 0.25)
                # fancy indexing along axis 1 may return Fortran order
                b = np.ascontiguousarray(parts[0] if len(parts) == 1 else
                                         np.concatenate(parts, axis=1))
                sbuf.append(b)
                sreq.append(p2p.Isend(b, dest=pr.rank, tag=d))
            # on-rank copies and boundary conditions while messages fly
            if len(ph.copy_dst):
                V[:, ph.copy_dst] = V[:, ph.copy_src]
            if len(ph.f2c_dst):
                g = V[:, ph.f2c_src].reshape(nvg, 4, -1)
                t = g[:, 0] + g[:, 1]
                t += g[:, 2]
                t += g[:, 3]
                V[:, ph.f2c_dst] = t
            if len(ph.c2f_dst):
                V[:, ph.c2f_dst] = V[:, ph.c2f_src] * 0.25
            if rreq:
                MPI.Request.Waitall(rreq)
                i = 0
                for pr in ph.partners:
                    if pr.rlen:
                        V[:, pr.r_dst] = rbuf[i][:, pr.r_bsel]
                        i += 1
            if sreq:
                MPI.Request.Waitall(sreq)
