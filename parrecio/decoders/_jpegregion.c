/* Decode one region of a JPEG with libjpeg(-turbo): the rows and columns a crop needs, no more; and
 * verify(data), libjpeg's first warning about a JPEG, for Image(strict=True) (see verify below).
 *
 * decode_region(data, x, y, w, h, scale_denom, flags) -> (buffer, x0, width) or None
 *
 * The region [x, x + w) x [y, y + h) is in pixels of the image scaled by 1/scale_denom (libjpeg's DCT
 * scaling: 1, 2, 4 or 8).  libjpeg-turbo's jpeg_crop_scanline() widens the columns to whole iMCUs, so the
 * decoded rows cover columns [x0, x0 + width) (x0 <= x, x0 + width == x + w); the rows above y are
 * skipped with jpeg_skip_scanlines() (entropy-decoded only: no IDCT, no upsampling, no colour
 * conversion).  The buffer (a bytearray libjpeg writes into) holds h rows of width pixels, RGBX (4 bytes;
 * grey JPEGs replicated, as Pillow's L -> RGB) or, with flags & GRAY (1), L (1 byte: luma only).  With
 * flags & FRAMED (2) it holds y + h rows of x + w pixels instead, the region at its place and the rest
 * left unwritten: the caller gives Pillow the image in the whole decode's coordinates and reads only the
 * region (no copy to shift it there).  The settings are libjpeg's defaults, as Pillow decodes (ISLOW DCT,
 * fancy upsampling), so the pixels are the ones a whole decode gives at those places, except within a
 * pixel of the region's left and right edges, where the chroma upsampling lacks the neighbours outside.
 * With 4x2 or 2x4 luma sampling and DCT scaling, libjpeg-turbo before 3.0 upsamples the chroma of a
 * cropped row only partly (its bug #669, the rest of the row left uninitialized): the component widths
 * are set right after jpeg_crop_scanline() (see crop_columns).
 *
 * The verdict on damage does not depend on the region.  After its last row, the bytes left are looked at:
 * entropy-coded data, restart markers and an end of image cannot make libjpeg fail, so then the region is
 * the answer; anything else (a marker inside the scan, none at the end) and the rest of the scan is
 * entropy-decoded (rows skipped) and jpeg_finish_decompress() reads the markers up to EOI, as the whole
 * decode does: an error or a warning anywhere in the file gives None.  Progressive (multi-scan) files
 * are read whole by jpeg_start_decompress() anyway.  Arithmetic-coded files give None (Pillow's
 * suspending data source fails on some that libjpeg reading from memory decodes).
 *
 * None means "let Pillow do it": any libjpeg error or warning (corrupt or truncated data: Pillow then
 * says what is wrong), a colour space other than YCbCr/grey, or a region outside the image.
 * The GIL is released while libjpeg works.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <jpeglib.h>
#include <jerror.h>

#if JPEG_LIB_VERSION >= 70
#define COMP_DCT_SIZE(c) ((c)->DCT_h_scaled_size)
#define MIN_DCT_SIZE(ci) ((ci)->min_DCT_h_scaled_size)
#else
#define COMP_DCT_SIZE(c) ((c)->DCT_scaled_size)
#define MIN_DCT_SIZE(ci) ((ci)->min_DCT_scaled_size)
#endif

#define FLAG_GRAY 1
#define FLAG_FRAMED 2

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

static JDIMENSION div_up(unsigned long long a, unsigned long long b) {
    return (JDIMENSION)((a + b - 1) / b);
}

/* The columns to decode: jpeg_crop_scanline()'s alignment of [x, x + w) to whole iMCUs, or the whole
 * width where cropping would give a component plane fewer than 3 samples (there libjpeg picks another
 * upsampling method than for the whole image).  A component's cropped width counts its IDCT scaling:
 * with 4x2 or 2x4 luma and DCT scaling libjpeg upsamples chroma partly in the IDCT, and libjpeg-turbo
 * before 3.0 left that out (its bug #669: chroma upsampled over part of the row, the rest of the row
 * uninitialized).  Returns whether to crop. */
static int crop_columns(j_decompress_ptr cinfo, JDIMENSION x, JDIMENSION w, JDIMENSION *x0,
                        JDIMENSION *width) {
    int ci, single = cinfo->comps_in_scan == 1 && cinfo->num_components == 1;
    JDIMENSION align = (JDIMENSION)MIN_DCT_SIZE(cinfo) * (single ? 1 : (JDIMENSION)cinfo->max_h_samp_factor);
    *x0 = 0;
    *width = cinfo->output_width;
    if (w == cinfo->output_width || align == 0) {
        return 0;
    }
    JDIMENSION start = x / align * align, cropped = w + x - start;
    for (ci = 0; ci < cinfo->num_components; ci++) {
        jpeg_component_info *comp = &cinfo->comp_info[ci];
        JDIMENSION plain = div_up((unsigned long long)cropped * comp->h_samp_factor,
                                  (unsigned long long)cinfo->max_h_samp_factor);
        if (plain < 3) {
            return 0;
        }
    }
    *x0 = start;
    *width = cropped;
    return 1;
}

static void fix_downsampled_widths(j_decompress_ptr cinfo) {
    int ci;
    for (ci = 0; ci < cinfo->num_components; ci++) { /* libjpeg-turbo 3.0's formula (a no-op there) */
        jpeg_component_info *comp = &cinfo->comp_info[ci];
        comp->downsampled_width = div_up((unsigned long long)cinfo->output_width * comp->h_samp_factor
                                         * COMP_DCT_SIZE(comp),
                                         (unsigned long long)cinfo->max_h_samp_factor * MIN_DCT_SIZE(cinfo));
    }
}

/* Whether the entropy-coded data from p on holds no marker but restarts before an end of image: then
 * nothing after it can make libjpeg fail (decoding only warns; RSTn and EOI are read without error), and
 * the rest of the scan need not be decoded to know the whole decode's verdict. */
static int rest_is_clean(const unsigned char *p, size_t n) {
    const unsigned char *end = p + n;
    while (p < end) {
        const unsigned char *ff = memchr(p, 0xFF, (size_t)(end - p));
        if (ff == NULL) {
            return 0; /* no end of image: libjpeg warns */
        }
        p = ff + 1;
        while (p < end && *p == 0xFF) { /* fill bytes */
            p++;
        }
        if (p == end) {
            return 0;
        }
        unsigned char marker = *p++;
        if (marker == 0xD9) {
            return 1;
        }
        if (marker != 0x00 && (marker < 0xD0 || marker > 0xD7)) {
            return 0; /* another marker inside or after the scan: let libjpeg read it */
        }
    }
    return 0;
}

static void read_row(j_decompress_ptr cinfo, JSAMPROW row) {
    if (jpeg_read_scanlines(cinfo, &row, 1) != 1) {
        longjmp(((struct region_error *)cinfo->err)->jump, 1);
    }
}

/* After the region's last row: make sure that the rest of the file would not make the whole decode fail,
 * so that the verdict on a damaged file does not depend on the crop.  Multi-scan (progressive) images
 * were read whole by jpeg_start_decompress(); a single scan whose remaining bytes are clean cannot fail;
 * any other is decoded to its end (entropy decoding only, rows skipped) and its markers read up to EOI,
 * where an error or a warning long-jumps out. */
static void finish(j_decompress_ptr cinfo, unsigned char *scratch) {
    JDIMENSION left = cinfo->output_height - cinfo->output_scanline;
    if (left > 0 && jpeg_has_multiple_scans(cinfo)) {
        jpeg_skip_scanlines(cinfo, left);
    } else if (left > 0) {
        if (cinfo->unread_marker == 0
                && rest_is_clean(cinfo->src->next_input_byte, cinfo->src->bytes_in_buffer)) {
            return;
        }
        JDIMENSION imcu = (JDIMENSION)MIN_DCT_SIZE(cinfo) * (JDIMENSION)cinfo->max_v_samp_factor;
        /* Skipping to the very end would not decode the rest (libjpeg then only marks the end of input):
         * stop a row short and read that row.  And jpeg_skip_scanlines() from inside an iMCU row decodes
         * too much with some sampling factors (2x4 at DCT scale 1/2: "premature end of data segment"), so
         * read on to the next iMCU row first. */
        while (left > 1 && cinfo->output_scanline % imcu != 0) {
            read_row(cinfo, scratch);
            left--;
        }
        if (left > 1) {
            jpeg_skip_scanlines(cinfo, left - 1);
        }
        read_row(cinfo, scratch);
    }
    jpeg_finish_decompress(cinfo); /* the markers after the scan, up to EOI */
}

static PyObject *decode_region(PyObject *self, PyObject *args) {
    Py_buffer data;
    int x, y, w, h, scale, flags;
    if (!PyArg_ParseTuple(args, "y*iiiiii", &data, &x, &y, &w, &h, &scale, &flags)) {
        return NULL;
    }
    int gray = (flags & FLAG_GRAY) != 0, framed = (flags & FLAG_FRAMED) != 0;
    if (w < 1 || h < 1 || x < 0 || y < 0 || (scale != 1 && scale != 2 && scale != 4 && scale != 8)) {
        PyBuffer_Release(&data);
        Py_RETURN_NONE;
    }
    struct jpeg_decompress_struct cinfo;
    struct region_error err;
    PyObject *volatile buffer = NULL;
    unsigned char *volatile scratch = NULL;
    volatile int ok = 0;
    JDIMENSION x0 = 0, width = 0;
    size_t pixel = gray ? 1 : 4, stride = 0, offset = 0;
    memset(&cinfo, 0, sizeof(cinfo));
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = on_error;
    err.pub.emit_message = on_message;
    Py_BEGIN_ALLOW_THREADS
    if (setjmp(err.jump) == 0) {
        jpeg_create_decompress(&cinfo);
        jpeg_mem_src(&cinfo, (const unsigned char *)data.buf, (unsigned long)data.len);
        jpeg_read_header(&cinfo, TRUE);
        if ((cinfo.jpeg_color_space == JCS_YCbCr || cinfo.jpeg_color_space == JCS_GRAYSCALE)
                && !cinfo.arith_code) {
            cinfo.out_color_space = gray ? JCS_GRAYSCALE : JCS_EXT_RGBX;
            cinfo.scale_num = 1;
            cinfo.scale_denom = (unsigned int)scale;
            jpeg_start_decompress(&cinfo);
            if ((JDIMENSION)x + (JDIMENSION)w <= cinfo.output_width
                    && (JDIMENSION)y + (JDIMENSION)h <= cinfo.output_height) {
                if (crop_columns(&cinfo, (JDIMENSION)x, (JDIMENSION)w, &x0, &width)) {
                    JDIMENSION got_x0 = (JDIMENSION)x, got_width = (JDIMENSION)w;
                    jpeg_crop_scanline(&cinfo, &got_x0, &got_width);
                    if (got_x0 != x0 || got_width != width) {
                        longjmp(err.jump, 1); /* another alignment than ours: give up */
                    }
                    fix_downsampled_widths(&cinfo);
                }
                size_t rows = framed ? (size_t)y + (size_t)h : (size_t)h;
                stride = (framed ? (size_t)x0 + width : (size_t)width) * pixel;
                offset = framed ? (size_t)y * stride + (size_t)x0 * pixel : 0;
                Py_BLOCK_THREADS
                if (rows <= (size_t)PY_SSIZE_T_MAX / stride) { /* uninitialized: only the region is written */
                    buffer = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(rows * stride));
                }
                PyErr_Clear(); /* no memory: None, Pillow decodes it (and says so) */
                Py_UNBLOCK_THREADS
                scratch = (unsigned char *)malloc((size_t)width * pixel);
                if (buffer != NULL && scratch != NULL) {
                    unsigned char *base = (unsigned char *)PyByteArray_AS_STRING(buffer) + offset;
                    JSAMPROW row;
                    int done = 0;
                    if (y > 0) {
                        jpeg_skip_scanlines(&cinfo, (JDIMENSION)y);
                    }
                    while (done < h) {
                        row = base + (size_t)done * stride;
                        if (jpeg_read_scanlines(&cinfo, &row, 1) != 1) {
                            break;
                        }
                        done++;
                    }
                    if (done == h) {
                        finish(&cinfo, scratch);
                        ok = 1;
                    }
                }
            }
        }
    }
    jpeg_destroy_decompress(&cinfo); /* also after a longjmp: frees what libjpeg holds */
    free(scratch);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (!ok) {
        Py_XDECREF(buffer);
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(Nii)", buffer, (int)x0, (int)width);
}

/* verify(data) -> None or str: decode the whole JPEG as cheaply as libjpeg can while still reading all of
 * its entropy-coded data and markers (1/8 DCT scaling: the IDCT is the DC term alone; luma only), and
 * return libjpeg's message for the first warning or error, None when there is none.  A warning is
 * what a whole decode (Pillow's) passes over with grey or smeared blocks: corrupt data, a scan cut short
 * before an EOI, extraneous bytes before a marker.  The GIL is released while libjpeg works. */
struct verify_error {
    struct region_error base;
    char message[JMSG_LENGTH_MAX];
};

static void on_verify_message(j_common_ptr cinfo, int level) {
    /* Two warnings are about metadata, not the image data: a JFIF version 2.x header and an Adobe marker's
       unknown colour transform code (libjpeg then uses its default colour space, as Pillow's decode does). */
    int code = cinfo->err->msg_code;
    if (level < 0 && code != JWRN_JFIF_MAJOR && code != JWRN_ADOBE_XFORM) {
        struct verify_error *err = (struct verify_error *)cinfo->err;
        (*cinfo->err->format_message)(cinfo, err->message);
        longjmp(err->base.jump, 1);
    }
}

static void on_verify_error(j_common_ptr cinfo) {
    struct verify_error *err = (struct verify_error *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, err->message);
    longjmp(err->base.jump, 1);
}

static PyObject *verify(PyObject *self, PyObject *args) {
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) {
        return NULL;
    }
    struct jpeg_decompress_struct cinfo;
    struct verify_error err;
    unsigned char *volatile row = NULL;
    volatile int failed = 0;
    memset(&cinfo, 0, sizeof(cinfo));
    err.message[0] = 0;
    cinfo.err = jpeg_std_error(&err.base.pub);
    err.base.pub.error_exit = on_verify_error;
    err.base.pub.emit_message = on_verify_message;
    Py_BEGIN_ALLOW_THREADS
    if (setjmp(err.base.jump) == 0) {
        jpeg_create_decompress(&cinfo);
        jpeg_mem_src(&cinfo, (const unsigned char *)data.buf, (unsigned long)data.len);
        jpeg_read_header(&cinfo, TRUE);
        cinfo.scale_num = 1;
        cinfo.scale_denom = 8;
        cinfo.dct_method = JDCT_IFAST;
        cinfo.do_fancy_upsampling = FALSE;
        if (cinfo.jpeg_color_space == JCS_YCbCr || cinfo.jpeg_color_space == JCS_GRAYSCALE) {
            cinfo.out_color_space = JCS_GRAYSCALE;  /* luma only: chroma is entropy-decoded all the same */
        }
        jpeg_start_decompress(&cinfo);
        row = (unsigned char *)malloc((size_t)cinfo.output_width * (size_t)cinfo.output_components + 16);
        if (row == NULL) {
            strcpy(err.message, "out of memory");
            failed = 1;
        } else {
            while (cinfo.output_scanline < cinfo.output_height) {
                JSAMPROW r = row;
                if (jpeg_read_scanlines(&cinfo, &r, 1) != 1) {
                    strcpy(err.message, "the data ends before the last row");
                    failed = 1;
                    break;
                }
            }
            if (!failed) {
                jpeg_finish_decompress(&cinfo); /* the markers after the scans, up to EOI */
            }
        }
    } else {
        failed = 1;
    }
    jpeg_destroy_decompress(&cinfo);
    free(row);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (!failed) {
        Py_RETURN_NONE;
    }
    return PyUnicode_DecodeLatin1(err.message, (Py_ssize_t)strlen(err.message), "replace");
}

static PyMethodDef methods[] = {
    {"decode_region", decode_region, METH_VARARGS,
     "decode_region(data, x, y, w, h, scale_denom, flags) -> (bytearray, x0, width) or None\n"
     "flags: GRAY (1) for L output, FRAMED (2) for the region at its place in a (y+h) x (x+w) buffer"},
    {"verify", verify, METH_VARARGS,
     "verify(data) -> None or str: libjpeg's message for the first warning or error of a whole decode"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_jpegregion", NULL, -1, methods};

PyMODINIT_FUNC PyInit__jpegregion(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL) {
        PyModule_AddIntConstant(m, "LIBJPEG_VERSION", JPEG_LIB_VERSION);
        PyModule_AddIntConstant(m, "GRAY", FLAG_GRAY);
        PyModule_AddIntConstant(m, "FRAMED", FLAG_FRAMED);
    }
    return m;
}
