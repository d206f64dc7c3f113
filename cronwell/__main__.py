"""`python -m cronwell` is the `cronwell` command."""

from cronwell.cli import main

main()
