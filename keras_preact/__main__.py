from keras_preact.cli import main

raise SystemExit(main())
