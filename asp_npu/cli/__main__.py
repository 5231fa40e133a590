"""`python -m asp_npu.cli ...`: the same entry point as the `asp-npu` script."""

import sys

from asp_npu.cli import main

sys.exit(main())
