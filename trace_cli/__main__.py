"""`python -m trace_cli` (and `accelerate launch -m trace_cli`) entry point."""

from trace_cli.cli import main

if __name__ == "__main__":
    main()
