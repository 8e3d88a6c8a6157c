# SPDX-License-Identifier: BSD-3-Clause
"""Tunables: parsing, validation, and how they settle for the node's load."""
import os
import warnings

import numpy as np
import pytest

from xhc import config


@pytest.fixture(autouse=True)
def _no_xhc_environment(monkeypatch):
    for key in list(os.environ):
        if key.startswith("XHC_"):
            monkeypatch.delenv(key)


@pytest.mark.parametrize("key, value, message", [
    ("sleep", "soon", r"^xhc tunable sleep: 'soon' is not a whole number; "
                      r"set XHC_SLEEP \(or sleep=\) to 0 \(never\) or a "
                      r"count of yields$"),
    ("sleep", "-1", r"^xhc tunable sleep: must be 0 \(never\) or a count of "
                    r"yields, not -1; set XHC_SLEEP \(or sleep=\) to such a "
                    r"value$"),
    ("windows", "many", r"tunable windows: 'many' is not a whole number"),
    ("windows", "1", r"^xhc tunable windows: must be auto or 2 to 64, not 1; "
                     r"set XHC_WINDOWS \(or windows=\) to such a value$"),
    ("windows", "65", r"windows: must be auto or 2 to 64, not 65;"),
    ("spin", "-3", r"spin: must be 0 or more, not -3; set XHC_SPIN"),
    ("spin", str(2**32), r"spin: must be at most 4294967295, not 4294967296; "
                         r"set XHC_SPIN"),
    ("sleep", str(2**32), r"sleep: must be at most 4294967295, not "
                          r"4294967296; set XHC_SLEEP"),
    ("seq_start", "-1", r"seq_start: must be 0 or more"),
    ("seq_start", str(2**64), r"seq_start: must be at most"),
    ("split_nodes", str(2**31), r"split_nodes: must be at most 2147483647, "
                                r"not 2147483648; set XHC_SPLIT_NODES"),
    ("split_nodes", str(10**21), r"split_nodes: must be at most 2147483647"),
    ("cico_max", "1G", r"^xhc tunable cico_max: must be at most 4194304 "
                       r"\(4M\), not 1073741824; set XHC_CICO_MAX "
                       r"\(or cico_max=\) lower$"),
    ("chunk_size", "128M", r"chunk_size: must be at most 67108864 \(64M\), "
                           r"not 134217728; set XHC_CHUNK_SIZE"),
    ("chunk_size", "5000", r"chunk_size: must be a multiple of 64, at least "
                           r"4K, not 5000; set XHC_CHUNK_SIZE"),
    ("chunk_size", "2K", r"chunk_size: must be a multiple of 64, at least "
                         r"4K, not 2048"),
    ("cico_max", "200", r"cico_max: must be a multiple of 64, at least 128"),
    ("cico_max", "64", r"cico_max: must be a multiple of 64, at least 128"),
    ("timeout", "nan", r"timeout: must be a finite number of seconds above "
                       r"0, not nan"),
    ("timeout", "inf", r"timeout: must be a finite number of seconds above "
                       r"0, not inf"),
    ("timeout", "0", r"timeout: must be a finite number of seconds above 0"),
    ("timeout", "", r"^xhc tunable timeout: '' is not a number of "
                    r"seconds; set XHC_TIMEOUT \(or timeout=\) to a finite "
                    r"number of seconds above 0$"),
    ("timeout", "abc", r"^xhc tunable timeout: 'abc' is not a number of "
                       r"seconds; set XHC_TIMEOUT"),
    ("cico_max", "64KB!", r"^xhc tunable cico_max: bad size '64KB!': use a "
                          r"number with an optional K, M or G suffix"),
    ("windows", "lots", r"tunable windows: 'lots' is not a whole number; "
                        r"set XHC_WINDOWS \(or windows=\) to auto or 2 to "
                        r"64$"),
    ("copy", "fast", r"^xhc tunable copy: must be auto, xpmem, adaptive, cma "
                     r"or cico, not 'fast'; set XHC_COPY \(or copy=\) to "
                     r"such a value$"),
    ("debug", "2", r"^xhc tunable debug: '2' is neither on \(1, true, yes, "
                   r"on\) nor off \(0, false, no, off\); set XHC_DEBUG "
                   r"\(or debug=\) to one of those$"),
])
def test_bad_values_name_the_variable(monkeypatch, key, value, message):
    monkeypatch.setenv("XHC_" + key.upper(), value)
    with pytest.raises(ValueError, match=message):
        config.resolve()


@pytest.mark.parametrize("value, on", [("1", True), ("ON", True),
                                       ("yes", True), (True, True),
                                       ("0", False), ("off", False),
                                       ("", False), (False, False)])
def test_debug_words(value, on):
    assert config.resolve(debug=value)["debug"] is on


@pytest.mark.parametrize("text", ["64K", "64k", "64KB", "64kb", "64KiB",
                                  "64kib", " 64 KiB ", "65536", "65536B"])
def test_sizes_take_the_suffixes_the_readme_writes(text):
    assert config.parse_size(text) == 65536


@pytest.mark.parametrize("text", ["64iB", "64KK", "K", "-64K", "64KiBB"])
def test_sizes_refuse_what_is_no_size(text):
    with pytest.raises(ValueError, match=r"^bad size "):
        config.parse_size(text)


def test_largest_values_pass():
    cfg = config.resolve(spin=2**32 - 1, seq_start=2**64 - 1,
                         cico_max="4M", chunk_size="64M", sleep=2**32 - 1)
    assert (cfg["spin"], cfg["cico_max"]) == (2**32 - 1, 4 << 20)


def test_spaces_around_a_value_are_ignored(monkeypatch):
    """As around a number, so around a word: XHC_COPY="cma " is cma."""
    monkeypatch.setenv("XHC_COPY", "cma ")
    monkeypatch.setenv("XHC_DEBUG", " 1")
    monkeypatch.setenv("XHC_WINDOWS", " auto")
    monkeypatch.setenv("XHC_SPIN", " 4 ")
    cfg = config.resolve()
    assert (cfg["copy"], cfg["debug"], cfg["windows"], cfg["spin"]) == (
        "cma", True, "auto", 4)


def test_unknown_keywords_are_refused():
    config.resolve(spin=1, debug=True)
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) \['chunksize', "
                       r"'timout'\]; the tunables are hierarchy, topology, "
                       r"cico_max, chunk_size, timeout"):
        config.resolve(chunksize=1, timout=5, spin=2)


def test_hierarchy_specs_are_checked_and_none_keeps_the_default():
    specs = config.hierarchies({"bcast": None, "allreduce": "node"})
    assert specs["bcast"] == config.HIERARCHY_DEFAULTS["bcast"]
    assert specs["allreduce"] == "node"
    with pytest.raises(ValueError, match=r"^xhc tunable hierarchy: unknown "
                       r"hierarchy level 'l9'; accepted: .*; set "
                       r"XHC_HIERARCHY \(or hierarchy=\) to levels such as "
                       r"'numa,socket', or flat$"):
        config.hierarchies({"reduce": "l3,l9"})
    with pytest.raises(ValueError, match=r"^xhc tunable hierarchy: bad level "
                       r"'virtual:x': K in virtual:K must be an integer >= 1"):
        config.hierarchies("virtual:x")
    with pytest.raises(ValueError, match=r"^xhc tunable hierarchy: no such "
                       r"operations as \['gather'\]; key hierarchy= by "
                       r"the operations \['allreduce', "):
        config.hierarchies({"gather": "numa"})
    with pytest.raises(TypeError, match=r"^xhc tunable hierarchy: a "
                       r"hierarchy spec is a comma string .*not int; set "):
        config.hierarchies({"bcast": 5})


@pytest.mark.parametrize("given, kind, message", [
    ({"spin": 1.5}, ValueError, r"^xhc tunable spin: 1.5 is not a whole "
                                r"number; set XHC_SPIN \(or spin=\)"),
    ({"sleep": -0.5}, ValueError, r"tunable sleep: -0.5 is not a whole"),
    ({"windows": 2.9}, ValueError, r"tunable windows: 2.9 is not a whole"),
    ({"copy": "1"}, ValueError, r"copy: must be auto, xpmem, adaptive, cma "
                                r"or cico, not '1'"),
    # A value of the wrong type: TypeError, as Python raises.
    ({"copy": 1}, TypeError, r"^xhc tunable copy: must be a string, not int; "
                             r"set XHC_COPY \(or copy=\) to auto, xpmem, "),
    ({"timeout": [1]}, TypeError, r"^xhc tunable timeout: must be a number "
                                  r"or a string, not list; set XHC_TIMEOUT "),
    ({"spin": [1]}, TypeError, r"^xhc tunable spin: must be a number or a "
                               r"string, not list"),
    ({"cico_max": b"64K"}, TypeError, r"tunable cico_max: must be a number "
                                      r"or a string, not bytes"),
    ({"windows": {}}, TypeError, r"tunable windows: .*not dict"),
    ({"debug": [1]}, TypeError, r"^xhc tunable debug: must be a bool, an "
                                r"integer or a string, not list"),
    ({"cico_max": 65536.5}, ValueError, r"cico_max: 65536.5 is not a whole"),
])
def test_keywords_are_checked_as_the_variables(given, kind, message):
    """A keyword's value is refused where the same XHC_* value would be,
    naming the tunable, never truncated or failing inside a parser; one
    of the wrong type raises TypeError."""
    with pytest.raises(kind, match=message):
        config.resolve(**given)
    assert config.resolve(spin=7.0)["spin"] == 7
    assert config.resolve(cico_max=65536.0)["cico_max"] == 65536
    assert config.resolve(spin=np.int64(9), timeout=np.float32(2))["spin"] \
        == 9


def test_hierarchy_of_the_wrong_type_and_flat():
    with pytest.raises(TypeError, match=r"^xhc tunable hierarchy: must be a "
                       r"spec such as 'numa,socket'.*not int; set "
                       r"XHC_HIERARCHY \(or hierarchy=\) to such a value$"):
        config.hierarchies(5)
    from xhc.hierarchy import parse_levels
    assert parse_levels("flat") == [] == parse_levels("")


def test_keyword_wins_over_environment(monkeypatch):
    monkeypatch.setenv("XHC_WINDOWS", "9")
    assert config.resolve()["windows"] == 9
    assert config.resolve(windows="AUTO")["windows"] == "auto"
    assert config.resolve(windows=4, sleep=256)["windows"] == 4


@pytest.mark.parametrize(
    "nranks, ncpu, chunk, windows, spin, reduce_max, rs_window", [
        (2, 2, 256 << 10, 2, 16384, 0, 0),  # one rank per CPU: spin long
        (1, 64, 256 << 10, 2, 16384, 0, 0),
        # Crowded: deep Bcast staging, short spin, Reduce through the
        # slots, 1 MiB reduce-scatter windows.
        (3, 2, 256 << 10, 32, 16, 1 << 20, 1 << 20),
        (4, 2, 256 << 10, 32, 16, 1 << 20, 1 << 20),
        (8, 2, 256 << 10, 32, 16, 512 << 10, 1 << 20),  # 8x32x256K: 64M
        # 64 MiB caps the depth, 4 MiB the slots and 16 MiB the
        # reduce-scatter windows (above a chunk, or none); never fewer than
        # 2 windows; slots of powers of two, windows of whole lines.
        (16, 8, 256 << 10, 16, 16, 256 << 10, 1 << 20),
        (32, 16, 256 << 10, 8, 16, 128 << 10, 512 << 10),
        (48, 24, 256 << 10, 5, 16, 64 << 10, 349504),
        (64, 32, 256 << 10, 4, 16, 64 << 10, 0),
        (128, 64, 256 << 10, 2, 16, 0, 0),
        (8, 2, 1 << 20, 8, 16, 512 << 10, 0),
        (24, 12, 1 << 20, 2, 16, 128 << 10, 0),
        (4, 2, 2 << 20, 8, 16, 1 << 20, 0),
    ])
def test_fit_to_load(nranks, ncpu, chunk, windows, spin, reduce_max,
                     rs_window):
    cfg = config.resolve(chunk_size=chunk)
    # Ranks bound round-robin to the CPUs, as mpiexec --bind-to core would.
    cpu_sets = [[r % ncpu] for r in range(nranks)]
    crowded, cpus = config.fit_to_load(cfg, cpu_sets)
    assert crowded == (nranks > ncpu) and cpus == min(nranks, ncpu)
    assert (cfg["windows"], cfg["spin"], cfg["sleep"]) == (windows, spin, 0)
    assert cfg["reduce_cico_max"] == reduce_max
    assert cfg["rs_window"] == rs_window


@pytest.mark.parametrize("cpu_sets,crowded", [
    ([[0], [0], [0, 1, 2, 3]], True),         # two bound to one CPU
    ([[0], [0], [1], [2, 3]], True),
    ([[0, 1], [0, 1], [0, 1], [2, 3]], True),  # three on two CPUs
    ([[0], [1], [0, 1, 2, 3]], False),        # a CPU each, and one more
    ([[0, 1], [0, 1], [2], [3]], False),
    ([[0], [1], [2], [3]], False),
])
def test_ranks_confined_to_fewer_cpus_than_they_are_crowd_the_node(
        cpu_sets, crowded):
    """Ranks with CPUs enough between them, some of which may run only on
    fewer CPUs than they are (as Open MPI binds an oversubscribed
    --cpu-set): crowded, or those spin as if each had a core."""
    cfg = config.resolve()
    assert config.fit_to_load(cfg, cpu_sets)[0] is crowded
    assert cfg["spin"] == (16 if crowded else config.DEFAULTS["spin"])


def test_fit_to_load_keeps_what_the_user_chose(monkeypatch):
    monkeypatch.setenv("XHC_CICO_MAX", "4K")
    chosen = config.chosen(windows=3, spin=700, sleep=5)
    assert chosen == {"windows", "spin", "sleep", "cico_max"}
    cfg = config.resolve(windows=3, spin=700, sleep=5)
    assert config.fit_to_load(cfg, [[0, 1]] * 8, chosen) == (True, 2)
    assert (cfg["windows"], cfg["spin"], cfg["sleep"]) == (3, 700, 5)
    # A chosen cico_max applies to Reduce too: no larger crowded slots.
    assert (cfg["cico_max"], cfg["reduce_cico_max"]) == (4096, 0)
    # A chosen chunk_size is the reduce-scatter's window too; a chosen
    # cico_max alone leaves it the crowded window.
    monkeypatch.delenv("XHC_CICO_MAX")
    for key in ("chunk_size", "cico_max"):
        cfg = config.resolve(**{key: 64 << 10})
        config.fit_to_load(cfg, [[0, 1]] * 8, config.chosen(**{key: 1}))
        want = 0 if key == "chunk_size" else \
            config.crowded_rs_window(8, cfg["chunk_size"])
        assert cfg[key] == 64 << 10 and cfg["rs_window"] == want, key
        assert want or key == "chunk_size"  # the crowded window is one


def test_fit_to_load_needs_a_line_per_rank_in_a_window():
    # Each rank owns whole 64-byte lines of every reduce-scatter window.
    cfg = config.resolve(chunk_size=4096)
    assert config.fit_to_load(cfg, [[0]] * 64) == (True, 1)
    with pytest.raises(ValueError, match=r"^xhc tunable chunk_size: 4096 is "
                       r"too small for 65 ranks \(a window holds 64 bytes per "
                       r"rank\); set XHC_CHUNK_SIZE \(or chunk_size=\) to at "
                       r"least 4160$"):
        config.fit_to_load(config.resolve(chunk_size=4096), [[0]] * 65)


def _loaded(nranks, ncpu, **given):
    cfg = config.resolve(**given)
    config.fit_to_load(cfg, [[r % ncpu] for r in range(nranks)],
                       config.chosen(**given))
    return cfg


def _segment(nranks):
    from xhc import _core
    return lambda cfg: _core.segment_size(nranks, cfg)


def test_fit_to_space_leaves_a_segment_that_fits():
    cfg = _loaded(4, 2)
    before = dict(cfg)
    size = _segment(4)
    assert config.fit_to_space(cfg, 4, size(cfg), size) == []
    assert cfg == before


@pytest.mark.parametrize("nranks, ncpu, free, shrunk, want", [
    # Docker's 64 MiB: a crowded node halves its Bcast staging depth,
    (4, 2, 64 << 20, ["windows"], {"windows": 4, "rs_window": 1 << 20}),
    # ... then its reduce-scatter windows (to a chunk's: none),
    (8, 2, 64 << 20, ["windows", "rs_window"],
     {"windows": 2, "rs_window": 512 << 10}),
    # ... then its Reduce slots.
    (4, 2, 24 << 20, ["windows", "rs_window", "reduce_cico_max"],
     {"windows": 2, "rs_window": 0, "reduce_cico_max": 256 << 10}),
    # One rank per CPU: chunk_size to 64 KiB, cico_max to 8 KiB, by turns,
    (64, 64, 64 << 20, ["chunk_size", "cico_max"],
     {"chunk_size": 64 << 10, "cico_max": 16 << 10}),
    # ... then as far as 16 KiB and 4 KiB.
    (4, 4, 1 << 20, ["chunk_size", "cico_max"],
     {"chunk_size": 16 << 10, "cico_max": 4 << 10}),
    # The chunk keeps a line per rank in a window: 64 x 512 = 32 KiB.
    (512, 512, 16 << 20, ["chunk_size", "cico_max"],
     {"chunk_size": 32 << 10, "cico_max": 4 << 10}),
])
def test_fit_to_space_shrinks_in_order(nranks, ncpu, free, shrunk, want):
    cfg, size = _loaded(nranks, ncpu), _segment(nranks)
    assert config.fit_to_space(cfg, nranks, free // 2, size) == shrunk
    assert {key: cfg[key] for key in want} == want
    if size(cfg) <= free // 2:
        # ... no further than it had to: one step less would not fit.
        last = shrunk[-1]
        bigger = dict(cfg, **{last: cfg[last] * 2})
        if last == "reduce_cico_max" and cfg[last] == 0:
            bigger[last] = 2 * cfg["cico_max"]
        assert size(bigger) > free // 2


def test_fit_to_space_keeps_what_the_user_chose():
    # 1 MiB chunks on 64 ranks: 274 MiB, and at least 260 whatever else
    # is cut.  Out of reach of a budget of 200, it gets as close as the
    # user's chunk_size lets it.
    cfg = _loaded(64, 64, chunk_size=1 << 20)
    size = _segment(64)
    shrunk = config.fit_to_space(cfg, 64, 200 << 20, size, {"chunk_size"})
    assert shrunk == ["cico_max"] and cfg["chunk_size"] == 1 << 20
    assert cfg["cico_max"] == 4 << 10 and 200 << 20 < size(cfg) < 261 << 20


def test_auto_is_no_choice(monkeypatch):
    monkeypatch.setenv("XHC_WINDOWS", "AUTO")
    assert config.chosen(chunk_size=1 << 20, copy="auto") == {"chunk_size"}


def test_space_is_shared_out_by_ranks():
    # Half of what is free, for all of a node's ranks; a quarter of
    # them, an eighth of it.
    assert config.space_budget(64 << 20, 8) == 32 << 20
    assert config.space_budget(64 << 20, 8, 8) == 32 << 20
    assert config.space_budget(64 << 20, 2, 8) == 8 << 20


def test_fit_segment_takes_the_least_room_of_any_rank():
    size = _segment(4)
    fit = config.fit_segment(_loaded(4, 2), 4, [1 << 30, None, 64 << 20],
                             4, size)
    assert (fit["free"], fit["budget"]) == (64 << 20, 32 << 20)
    assert fit["shrunk"] == ["windows"] and fit["bytes"] <= 32 << 20
    cfg = _loaded(4, 2)
    assert config.fit_segment(cfg, 4, [None] * 4, 4, size) == {
        "bytes": size(_loaded(4, 2)), "free": None, "budget": None,
        "shrunk": []}


def test_a_crowded_node_crowds_each_communicator_on_it():
    # Two ranks with a CPU each, on a node whose 4 processes share its 2
    # CPUs (a communicator of half of them): they wait and stage as
    # crowded ranks do.  With a CPU for each process, they do not.
    cfg = config.resolve()
    assert config.fit_to_load(cfg, [[0], [1]], (), (4, 2)) == (True, 2)
    assert cfg["spin"] == 16 and cfg["bcast_rounds"] == 16
    cfg = config.resolve()
    assert config.fit_to_load(cfg, [[0], [1]], (), (64, 64)) == (False, 2)
    assert config.fit_to_load(cfg, [[0], [1]], (), (0, 0)) == (False, 2)
    # A communicator of one rank there waits for no one: none of the
    # crowded extras, whose staging took 16 MiB of /dev/shm for nothing.
    cfg, alone = config.resolve(), config.resolve()
    assert config.fit_to_load(cfg, [[0]], (), (4, 2)) == (False, 1)
    config.fit_to_load(alone, [[0]])
    assert cfg == alone and cfg["bcast_rounds"] == cfg["rs_window"] == 0
    assert cfg["windows"] == 2 and cfg["spin"] == config.DEFAULTS["spin"]


@pytest.mark.parametrize("cpu_sets, load, why", [
    ([[0], [1], [0]], (3, 2), "more ranks than CPUs"),
    ([[0], [1]], (4, 2), "the job runs 4 processes on the node's 2 CPUs"),
    ([[0], [0], [0, 1, 2]], (3, 3),
     "some ranks are bound to fewer CPUs than share them"),
])
def test_info_says_what_crowds_the_ranks(cpu_sets, load, why):
    """python -m xhc info names, for crowded ranks, the reason
    fit_to_load found: ranks on one node cut in two (split_nodes) may
    have a CPU each and still be crowded by the job."""
    from xhc.__main__ import _crowded_by
    crowded, ncpu = config.fit_to_load(config.resolve(), cpu_sets, (), load)
    assert crowded and _crowded_by(cpu_sets, ncpu, load) == why


def test_what_was_cut_is_named_as_the_user_knows_it():
    """A cut crowded extra is named for what it is, with the size it now
    has (back at its tunable's, when cut to none) and what sets it."""
    cfg = {"rs_window": 0, "chunk_size": 256 << 10, "windows": 4,
           "reduce_cico_max": 128 << 10, "cico_max": 32 << 10}
    assert [config.cut_text(k, cfg) for k in cfg if k.startswith("r")] == [
        "crowded reduce-scatter window=262144 (set chunk_size to choose it)",
        "crowded Reduce slot size=131072 (set cico_max to choose it)"]
    assert config.cut_text("windows", cfg) == "windows=4"
    assert config.cut_name("rs_window") == "crowded reduce-scatter window"
    assert config.cut_name("chunk_size") == "chunk_size"


def test_a_misspelt_variable_is_named_once(monkeypatch):
    """An XHC_* variable close to one xhc reads draws a warning naming
    that one, once; names xhc reads, and names near none, draw none."""
    monkeypatch.setattr(config, "_MISSPELT_SAID", set())
    monkeypatch.setenv("XHC_CHUNKSIZE", "64K")
    monkeypatch.setenv("XHC_CHUNK_SIZE", "64K")
    monkeypatch.setenv("XHC_SOMETHING_ELSE", "1")
    monkeypatch.setenv("xhc_Debug", "1")
    with pytest.warns(RuntimeWarning) as said:
        config.resolve()
    assert [str(w.message) for w in said] == [
        "XHC_CHUNKSIZE is set, but xhc reads no such variable: did you "
        "mean XHC_CHUNK_SIZE?",
        "xhc_Debug is set, but xhc reads no such variable: did you mean "
        "XHC_DEBUG?"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert config.resolve()["chunk_size"] == 64 << 10


def test_a_misspelt_variable_made_an_error_raises_each_time(monkeypatch):
    """A filter that makes the warning an error raises on every call: the
    name counts as said only once it was."""
    monkeypatch.setattr(config, "_MISSPELT_SAID", set())
    monkeypatch.setenv("XHC_HIERACHY", "flat")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(2):
            with pytest.raises(RuntimeWarning, match="XHC_HIERARCHY"):
                config.resolve()
