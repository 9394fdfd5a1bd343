"""The sagegen command line (typer): `sagegen.cli.app:main`."""
