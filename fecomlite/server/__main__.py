"""`python -m fecomlite.server`: what `ensure_server` starts in the background."""

import typer

from fecomlite.server.command import server_command

typer.run(server_command)
