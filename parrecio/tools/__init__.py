"""Tools behind the ``parrecio`` command line that are useful from Python too.

- :mod:`.pack`: build RecordIO files -- an MXNet ``.rec`` + ``.idx`` (+ ``.lst``) from a folder of images
  or an im2rec list file, an augmented-manifest stream written the way SageMaker Pipe mode delivers it.
- :mod:`.inspect`: one streaming pass over a RecordIO stream: counts, sizes, content kinds, corruption.
- :mod:`.manifest`: augmented-manifest lines -> the records SageMaker Pipe mode would send.
- :mod:`.emulate`: SageMaker Pipe mode on this machine (``parrecio pipe-serve``): config and FIFOs.
- :mod:`.demo`: the built-in demo data set and its run (``parrecio demo``).
"""

from .inspect import inspect_stream, payload_kind
from .pack import (IMAGE_EXTENSIONS, ListItem, PackResult, list_image_folder, pack_image_list,
                   pack_manifest, read_image_list, write_image_list)

__all__ = ["inspect_stream", "payload_kind", "IMAGE_EXTENSIONS", "ListItem", "PackResult", "list_image_folder",
           "read_image_list", "write_image_list", "pack_image_list", "pack_manifest"]
