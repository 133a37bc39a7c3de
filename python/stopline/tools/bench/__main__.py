import sys

from stopline.bench import main

sys.exit(main())
