"""`python -m frlab.generated [--write]`: compare (or rewrite) every generated committed file."""

from frlab.generated import main

raise SystemExit(main())
