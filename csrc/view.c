/* SPDX-License-Identifier: BSD-3-Clause */
/* view.c: a rank's place in the hierarchy's tree for a given root.
 *
 * 1. The hierarchy arrives as levels x ranks -> group, bottom level first;
 *    the top level holds every rank in one group.
 * 2. A group's leader is the root if the root is in it, else its lowest
 *    rank.  The members of a level-L group are the leaders of the level
 *    L-1 groups inside it (every rank at level 0).
 * 3. Walking up from level 0, a rank collects the other members of each
 *    group it leads (its children) until it reaches a group it does not
 *    lead; that group's leader is its parent.
 * 4. Top-level members (the "peers") are kept apart: reductions finish
 *    there with every peer reading every other peer's contribution.
 */
#include <errno.h>
#include <stdlib.h>

#include "xhc_internal.h"

static int xhc_group_of(const struct xhc_hier *h, int n, int level, int r)
{
    return h->groups[(size_t)level * n + r];
}

static int xhc_leader_of(const struct xhc_hier *h, int n, int level,
                         int group, int root)
{
    if (xhc_group_of(h, n, level, root) == group)
        return root;
    for (int r = 0; r < n; r++)
        if (xhc_group_of(h, n, level, r) == group)
            return r;
    return -1;
}

/* Is R a member of its group at LEVEL, i.e. a leader at every level below? */
static int xhc_is_member(const struct xhc_hier *h, int n, int level, int r,
                         int root)
{
    for (int l = 0; l < level; l++) {
        int g = xhc_group_of(h, n, l, r);
        if (xhc_leader_of(h, n, l, g, root) != r)
            return 0;
    }
    return 1;
}

/* Append to OUT the members of MY group at LEVEL other than ME. */
static int xhc_collect(const struct xhc_hier *h, int n, int level, int me,
                       int root, int *out, int with_me)
{
    int g = xhc_group_of(h, n, level, me), k = 0;
    for (int r = 0; r < n; r++) {
        if (r == me && !with_me)
            continue;
        if (xhc_group_of(h, n, level, r) == g
            && xhc_is_member(h, n, level, r, root))
            out[k++] = r;
    }
    return k;
}

static struct xhc_view *xhc_view_build(const struct xhc_hier *h, int n,
                                       int me, int root)
{
    struct xhc_view *v = calloc(1, sizeof(*v));
    int *buf = malloc(sizeof(int) * 2 * (size_t)n);
    if (!v || !buf) {
        free(v);
        free(buf);
        return NULL;
    }
    v->child = buf;
    v->peer = buf + n;
    v->parent = -1;
    int top = h->nlevels - 1;
    for (int l = 0; l <= top; l++) {
        int g = xhc_group_of(h, n, l, me);
        int leader = xhc_leader_of(h, n, l, g, root);
        if (l == top)
            v->npeer = xhc_collect(h, n, l, me, root, v->peer, 1);
        if (leader != me) {
            v->parent = leader;
            break;
        }
        v->nchild += xhc_collect(h, n, l, me, root, v->child + v->nchild, 0);
        if (l < top)
            v->nsub = v->nchild;
    }
    return v;
}

const struct xhc_view *xhc_view_get(xhc_ctx_t *ctx, int kind, int root)
{
    struct xhc_hier *h = &ctx->hier[kind];
    if (!h->views)
        return NULL;
    if (!h->views[root])
        h->views[root] = xhc_view_build(h, ctx->nranks, ctx->rank, root);
    return h->views[root];
}

void xhc_hier_free(struct xhc_hier *h, int n)
{
    if (h->views) {
        for (int r = 0; r < n; r++) {
            if (h->views[r])
                free(h->views[r]->child);
            free(h->views[r]);
        }
    }
    free(h->views);
    free(h->groups);
    h->views = NULL;
    h->groups = NULL;
}

/* Is GROUPS (NLEVELS x N) a hierarchy: one group at the top, and ranks
 * that share a group at one level sharing one at every level above?  A
 * group that a parent's group does not hold would wait for ever. */
static int xhc_levels_nest(int n, int nlevels, const int *groups)
{
    const int *top = groups + (size_t)(nlevels - 1) * n;
    for (int r = 0; r < n; r++)
        if (top[r] != top[0])
            return 0;
    for (int l = 0; l + 1 < nlevels; l++) {
        const int *g = groups + (size_t)l * n, *up = g + n;
        for (int r = 0; r < n; r++)
            for (int s = r + 1; s < n; s++)
                if (g[r] == g[s] && up[r] != up[s])
                    return 0;
    }
    return 1;
}

int xhc_hier_set(struct xhc_hier *h, int n, int nlevels, const int *groups)
{
    if (nlevels < 1 || nlevels > XHC_MAX_LEVELS
        || !xhc_levels_nest(n, nlevels, groups))
        return XHC_ERR_HIERARCHY;
    xhc_hier_free(h, n);
    h->groups = malloc(sizeof(int) * (size_t)nlevels * n);
    h->views = calloc((size_t)n, sizeof(*h->views));
    if (!h->groups || !h->views) {
        xhc_hier_free(h, n);
        return -ENOMEM;
    }
    memcpy(h->groups, groups, sizeof(int) * (size_t)nlevels * n);
    h->nlevels = nlevels;
    return 0;
}
