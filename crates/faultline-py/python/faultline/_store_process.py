"""The store process's entry point: ``python -m faultline._store_process``
(started by :class:`faultline.PythonStore`; see ``faultline._host``). A
module of its own so that ``faultline._host`` is imported once, under its
own name, in the store process too."""

import sys

from faultline._host import _main

if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
