# SPDX-License-Identifier: BSD-3-Clause
"""What xhc.Comm does not define passes through to the communicator it
wraps: its attributes, read and set there, and a Cartesian or graph
communicator's own methods."""
import functools


class Forwarded:
    """An attribute of Comm that is NAME of the wrapped communicator, read
    and set there (xcomm.name = "solver" names the communicator); on the
    class, COMM_TYPE's own (xhc.Comm.Create_keyval is MPI's)."""
    def __init__(self, name, comm_type):
        self.name, self.comm_type = name, comm_type
        self.__doc__ = f"The wrapped communicator's {name}."

    def __get__(self, obj, cls=None):
        return getattr(self.comm_type if obj is None else obj._comm,
                       self.name)

    def __set__(self, obj, value):
        setattr(obj._comm, self.name, value)

    def __delete__(self, obj):
        delattr(obj._comm, self.name)


def add_passthrough(cls, comm_type):
    """Give CLS every public attribute of COMM_TYPE it does not define.

    Forwarding through properties, not __getattr__, keeps Python's fast
    method calls on the collectives (a class with __getattr__ loses them).
    """
    for name in dir(comm_type):
        if not name.startswith("_") and not hasattr(cls, name):
            setattr(cls, name, Forwarded(name, comm_type))
    return cls


@functools.lru_cache(maxsize=None)
def with_topology(base, comm_type):
    """The subclass of BASE (xhc.Comm) for COMM_TYPE (MPI.Cartcomm, say),
    which also forwards that type's own methods (Get_coords, Shift,
    ...)."""
    cls = type(base.__name__, (base,), {"__doc__": base.__doc__,
                                        "__module__": base.__module__})
    return add_passthrough(cls, comm_type)
