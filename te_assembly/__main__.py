from te_assembly.cli.main import run

run()
