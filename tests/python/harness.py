"""The op tests' helpers, under the name they have always been imported by (`from harness
import ...`): they live in opforge.testing, installed with the package, so that an op built
outside this checkout can use them too."""

from opforge.testing import *  # noqa: F401,F403
