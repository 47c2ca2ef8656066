import sys
from pathlib import Path

# the detector tests import their shared helpers as a plain module
sys.path.insert(0, str(Path(__file__).parent))
