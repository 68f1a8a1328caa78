from kvreplay.cli import main

raise SystemExit(main())
