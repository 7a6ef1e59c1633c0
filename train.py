"""One training run: `python train.py loss=cispo precision=fp32_head` (see `python train.py --help`)."""

from scalerl.cli import main

if __name__ == "__main__":
    main()
