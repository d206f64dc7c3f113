"""cronwell: scheduled jobs at fleet scale with exactly-once effect.

Exactly-once *effect* = at-least-once dispatch + idempotent execution, keyed by
`<job uid>:<nominal scheduled instant>`. This package is the core and the SDK that
handler code imports (`@cronwell.handler`).
"""

from cronwell.errors import CronwellError, LeaseLost, SpecError
from cronwell.sdk import Context, handler

__version__ = "0.1.0"

__all__ = ["Context", "CronwellError", "LeaseLost", "SpecError", "__version__", "handler"]
