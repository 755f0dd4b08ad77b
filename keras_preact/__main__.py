import sys

from keras_preact.cli import main

sys.exit(main())
