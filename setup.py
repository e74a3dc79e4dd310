"""The optional C part of parrecio: a JPEG region decoder on the system libjpeg (parrecio/decoders/_jpegregion.c).

Built when a C compiler and libjpeg's headers are there -- Pillow-SIMD, which builds from source, needs
the same.  Without them the build goes on without it (``optional=True``), and ``Image(crop=...)`` decodes
whole JPEGs with Pillow (the same pixels, a little slower) and ``Image(strict=True)`` checks JPEGs with
simplejpeg.  Everything else is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("parrecio.decoders._jpegregion", ["parrecio/decoders/_jpegregion.c"],
                             libraries=["jpeg"], optional=True)])
