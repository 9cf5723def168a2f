"""The `sluice` command of an installed package (pyproject.toml's [project.scripts]): runs the program that the
wheel carries in sluice/_bin, with this Python as the one its Python-driven commands (journey) use.  A module of
its own beside the package, not in it: importing the package would load numpy and the library first."""
import os
import sys


def main():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sluice", "_bin", "sluice")
    if not os.access(exe, os.X_OK):
        sys.exit(f"sluice: {exe} is missing: this package was not built with its command (pip install . or make wheel)")
    os.environ.setdefault("SLUICE_PYTHON", sys.executable)
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    main()
