from te_assembly.cli.main import main

raise SystemExit(main())
