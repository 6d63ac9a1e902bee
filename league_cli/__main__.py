import sys

from league_cli.main import main

sys.exit(main())
