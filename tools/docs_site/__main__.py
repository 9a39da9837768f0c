import sys

from tools.docs_site import main

sys.exit(main(sys.argv[1:]))
