"""`python -m sagegen ...` is the `sagegen` command."""

from .cli.app import main

if __name__ == "__main__":
    main()
