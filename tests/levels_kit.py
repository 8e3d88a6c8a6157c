# SPDX-License-Identifier: BSD-3-Clause
"""What test_hierarchy.py, test_topology.py and test_info.py share: the
partitions they expect, made without xhc, and the hwloc XML files in
tests/data."""
import os

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
# Generated once with: lstopo -i "pack:2 numa:1 l3:2 core:2 pu:2" --of xml
XML = os.path.join(DATA, "pack2-l3x2-core2-smt2.xml")
# Packages of 1, 2 and 2 cores, each its own NUMA node; an L3 over the
# first package's core alone.
XML_ONE_L3 = os.path.join(DATA, "l3-in-one-package.xml")


def by(n, fn):
    """Expected partition of range(N) by key FN, built independently of xhc."""
    groups = {}
    for rank in range(n):
        groups.setdefault(fn(rank), []).append(rank)
    return sorted(groups.values())
