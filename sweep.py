"""Run a study of many training runs: `python sweep.py --loo` (see `python sweep.py --help`, sweeps/README.md)."""

from scalerl.sweep.cli import program

if __name__ == "__main__":
    program()
