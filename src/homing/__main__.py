from homing.cli import main

raise SystemExit(main())
