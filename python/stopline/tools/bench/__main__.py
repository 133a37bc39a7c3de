import sys

from stopline.tools.bench import main

sys.exit(main())
