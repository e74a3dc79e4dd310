"""The optional C parts of parrecio: a JPEG region decoder on the system libjpeg (parrecio/decoders/_jpegregion.c)
and the RecordIO-protobuf wire format (parrecio/decoders/_protobuf.c).

Built when a C compiler (and, for the first, libjpeg's headers) are there -- Pillow-SIMD, which builds from
source, needs the same.  Without them the build goes on without them (``optional=True``): protobuf records are
parsed in Python (slower, the same results), and ``Image(crop=...)`` decodes
whole JPEGs with Pillow (the same pixels, a little slower) and ``Image(strict=True)`` checks JPEGs with
simplejpeg.  Everything else is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("parrecio.decoders._jpegregion", ["parrecio/decoders/_jpegregion.c"],
                             libraries=["jpeg"], optional=True),
                   # RecordIO-protobuf's wire format (no library); without it the Python parser reads it
                   Extension("parrecio.decoders._protobuf", ["parrecio/decoders/_protobuf.c"], optional=True)])
