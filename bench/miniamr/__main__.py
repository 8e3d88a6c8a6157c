# SPDX-License-Identifier: BSD-3-Clause
"""``python -m mpi4py -m bench.miniamr [options]``"""
import sys

from .driver import main

sys.exit(main())
