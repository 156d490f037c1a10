"""Tools for the sandbox tests, in a module that imports nothing (sandboxed workers import it under a memory limit)."""


def spin(n: int) -> str:
    """Busy-loop.

    Args:
        n: ignored
    """
    while True:
        n += 1


def hog(mb: int) -> str:
    """Allocate memory.

    Args:
        mb: megabytes
    """
    return str(len(bytearray(mb * 2**20)))

