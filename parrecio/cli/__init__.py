"""The ``parrecio`` command: ``parrecio <subcommand> ...`` (see :mod:`parrecio.cli.main`)."""
