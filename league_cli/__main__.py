import sys

from league_cli.processes import working_directory_last

working_directory_last()  # (only under `python -P`: see league_command)

from league_cli.main import main  # noqa: E402

sys.exit(main())
