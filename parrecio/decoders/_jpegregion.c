/* Decode one region of a JPEG with libjpeg(-turbo): the rows and columns a crop needs, no more.
 *
 * decode_region(data, x, y, w, h, scale_denom, gray) -> (buffer, x0, width) or None
 *
 * The region [x, x + w) x [y, y + h) is in pixels of the image scaled by 1/scale_denom (libjpeg's DCT
 * scaling: 1, 2, 4 or 8).  libjpeg-turbo's jpeg_crop_scanline() widens the columns to whole iMCUs, so the
 * decoded rows cover columns [x0, x0 + width) (x0 <= x, x0 + width >= x + w); the rows above y are
 * skipped with jpeg_skip_scanlines() (entropy-decoded only: no IDCT, no upsampling, no colour
 * conversion) and decoding stops after row y + h - 1.  The buffer holds h rows of width pixels, RGBX
 * (4 bytes) or, with gray, L (1 byte).  The settings are libjpeg's defaults, as Pillow decodes (ISLOW
 * DCT, fancy upsampling), so the pixels are the ones a full decode gives at those places.
 *
 * None means "let Pillow do it": any libjpeg error or warning (corrupt or truncated data: Pillow then
 * says what is wrong), a colour space other than YCbCr/grey, or a region outside the image.
 * The GIL is released while libjpeg works.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <jpeglib.h>

struct region_error {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
};

static void on_error(j_common_ptr cinfo) {
    longjmp(((struct region_error *)cinfo->err)->jump, 1);
}

static void on_message(j_common_ptr cinfo, int level) {
    if (level < 0) { /* a warning: corrupt or truncated data, which Pillow refuses */
        longjmp(((struct region_error *)cinfo->err)->jump, 1);
    }
}

static PyObject *decode_region(PyObject *self, PyObject *args) {
    Py_buffer data;
    int x, y, w, h, scale, gray;
    if (!PyArg_ParseTuple(args, "y*iiiiip", &data, &x, &y, &w, &h, &scale, &gray)) {
        return NULL;
    }
    if (w < 1 || h < 1 || x < 0 || y < 0 || (scale != 1 && scale != 2 && scale != 4 && scale != 8)) {
        PyBuffer_Release(&data);
        Py_RETURN_NONE;
    }
    struct jpeg_decompress_struct cinfo;
    struct region_error err;
    unsigned char *out = NULL;
    JDIMENSION x0 = 0, width = 0;
    int ok = 0, pixel = gray ? 1 : 4;
    memset(&cinfo, 0, sizeof(cinfo));
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    Py_BEGIN_ALLOW_THREADS
    if (setjmp(err.jump) == 0) {
        jpeg_create_decompress(&cinfo);
        jpeg_mem_src(&cinfo, (const unsigned char *)data.buf, (unsigned long)data.len);
        jpeg_read_header(&cinfo, TRUE);
        if (cinfo.jpeg_color_space == JCS_YCbCr || cinfo.jpeg_color_space == JCS_GRAYSCALE) {
            cinfo.out_color_space = gray ? JCS_GRAYSCALE : JCS_EXT_RGBX;
            cinfo.scale_num = 1;
            cinfo.scale_denom = (unsigned int)scale;
            jpeg_start_decompress(&cinfo);
            if ((JDIMENSION)(x + w) <= cinfo.output_width && (JDIMENSION)(y + h) <= cinfo.output_height) {
                x0 = (JDIMENSION)x;
                width = (JDIMENSION)w;
                jpeg_crop_scanline(&cinfo, &x0, &width);
                out = (unsigned char *)malloc((size_t)width * pixel * (size_t)h);
                if (out != NULL) {
                    if (y > 0) {
                        jpeg_skip_scanlines(&cinfo, (JDIMENSION)y);
                    }
                    JSAMPROW row;
                    int done = 0;
                    while (done < h) {
                        row = out + (size_t)done * width * pixel;
                        if (jpeg_read_scanlines(&cinfo, &row, 1) != 1) {
                            break;
                        }
                        done++;
                    }
                    ok = done == h;
                }
            }
        }
    }
    jpeg_destroy_decompress(&cinfo); /* also after a longjmp: frees what libjpeg holds */
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (!ok) {
        free(out);
        Py_RETURN_NONE;
    }
    PyObject *buffer = PyByteArray_FromStringAndSize((const char *)out, (Py_ssize_t)width * pixel * h);
    free(out);
    if (buffer == NULL) {
        return NULL;
    }
    return Py_BuildValue("(Nii)", buffer, (int)x0, (int)width);
}

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS,
     "decode_region(data, x, y, w, h, scale_denom, gray) -> (bytearray, x0, width) or None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpegregion", NULL, -1, methods};

PyMODINIT_FUNC PyInit__jpegregion(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL) {
        PyModule_AddIntConstant(m, "LIBJPEG_VERSION", JPEG_LIB_VERSION);
    }
    return m;
}
