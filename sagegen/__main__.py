"""`python -m sagegen ...` is the `sagegen` command."""

from sagegen.cli.app import main

if __name__ == "__main__":
    main()
