"""``python -m interlock``: the same as the ``interlock`` command."""

from .cli import main

if __name__ == "__main__":
    main()
