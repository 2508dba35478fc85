import sys

from vllm_sim.cli import main

sys.exit(main())
