/* The wire-format part of parrecio.decoders.protobuf_record, in C: one aialgs.data.Record walked in a
 * single pass, its packed values copied once into bytearrays (numpy views them without a copy).
 *
 * parse(data) -> (features, label, strings)
 *   features, label: lists of (name, kind, values, keys, shape) in the record's order, where kind is the
 *     Value field number (2 float32, 3 float64, 7 int32: values a bytearray of little-endian float32 /
 *     float64 / int32; keys None or a bytearray of little-endian uint64; shape None or a tuple of ints),
 *     or 9 (Bytes: values a list of bytes, keys and shape None);
 *   strings: {"uid" | "metadata" | "configuration": str}.
 * A payload that is not a whole Record raises ValueError whose message starts with "truncated: "; any
 * other refusal (a varint over 64 bits, a group, an int32 out of range, ...) a ValueError with the same
 * words as the Python parser.  The semantic checks (shape against values, keys inside the shape) are
 * Python's, on the arrays.  Nothing is allocated by a declared size: a length is checked against the
 * bytes that are there before anything is copied.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    const unsigned char *p, *end;
} span;

static int fail(const char *message) {
    PyErr_SetString(PyExc_ValueError, message);
    return -1;
}

/* UTF-8 text, or a ValueError worded as the Python parser words it: "<what> is not valid UTF-8 (<reason>
 * at byte <start>)". */
static PyObject *utf8(span f, const char *what) {
    PyObject *text = PyUnicode_DecodeUTF8((const char *)f.p, (Py_ssize_t)(f.end - f.p), "strict");
    if (text != NULL || !PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        return text;
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    Py_ssize_t start = 0;
    PyObject *reason = value ? PyUnicodeDecodeError_GetReason(value) : NULL;
    if (value) {
        PyUnicodeDecodeError_GetStart(value, &start);
    }
    PyErr_Clear();
    if (reason != NULL) {
        PyErr_Format(PyExc_ValueError, "%s is not valid UTF-8 (%U at byte %zd)", what, reason, start);
    } else {
        PyErr_Format(PyExc_ValueError, "%s is not valid UTF-8", what);
    }
    Py_XDECREF(reason);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return NULL;
}

static int varint(span *s, uint64_t *out) {
    uint64_t result = 0;
    int shift = 0;
    while (1) {
        if (s->p >= s->end) {
            return fail("truncated: a varint runs past the end of its message");
        }
        unsigned char b = *s->p++;
        if (shift == 63) { /* the 10th byte: the last one, holding the 64th bit only */
            if (b & 0x80) {
                return fail("a varint longer than 10 bytes");
            }
            if (b > 1) {
                return fail("a varint longer than 64 bits");
            }
        }
        result |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *out = result;
            return 0;
        }
        shift += 7;
        if (shift >= 70) {
            return fail("a varint longer than 10 bytes");
        }
    }
}

/* The next field of the message: number, wire type, and its value's bytes (for wire type 2 the content). */
static int next_field(span *s, uint64_t *number, int *wire, span *value) {
    uint64_t key, n;
    if (varint(s, &key) < 0) {
        return -1;
    }
    *number = key >> 3;
    *wire = (int)(key & 7);
    if (*number == 0) {
        return fail("a field numbered 0");
    }
    value->p = s->p;
    switch (*wire) {
    case 0:
        if (varint(s, &n) < 0) {
            return -1;
        }
        break;
    case 1:
    case 5: {
        size_t size = *wire == 1 ? 8 : 4;
        if ((size_t)(s->end - s->p) < size) {
            return fail("truncated: a field runs past the end of its message");
        }
        s->p += size;
        break;
    }
    case 2:
        if (varint(s, &n) < 0) {
            return -1;
        }
        if (n > (uint64_t)(s->end - s->p)) {
            PyErr_Format(PyExc_ValueError, "truncated: field %llu declares %llu bytes, past the end of its "
                         "message", (unsigned long long)*number, (unsigned long long)n);
            return -1;
        }
        value->p = s->p;
        s->p += n;
        break;
    default:
        PyErr_Format(PyExc_ValueError, "a field of wire type %d (a group), which aialgs.data.Record has not",
                     *wire);
        return -1;
    }
    value->end = s->p;
    return 0;
}

/* Append the varints of v (packed, or the one of an unpacked field) to buf as little-endian uint64 (or,
 * with as_int32, as int32 after a range check). */
static int append_varints(PyObject *buf, span v, int as_int32, PyObject *name) {
    /* The checks of the whole field first, in the Python parser's order: cut short, a varint over 10
     * bytes, one over 64 bits; then the values (and the int32 range). */
    if (v.p < v.end && (v.end[-1] & 0x80)) {
        return fail("truncated: a packed varint runs past the end of its field");
    }
    int run = 0, overflow = 0;
    for (const unsigned char *q = v.p; q < v.end; q++) {
        run++;
        if (!(*q & 0x80)) {
            overflow |= run == 10 && *q > 1;
            run = 0;
        } else if (run >= 10) {
            return fail("a varint longer than 10 bytes");
        }
    }
    if (overflow) {
        return fail("a varint longer than 64 bits");
    }
    while (v.p < v.end) {
        uint64_t x;
        if (varint(&v, &x) < 0) {
            if (PyErr_ExceptionMatches(PyExc_ValueError)) {
                PyObject *type, *value, *tb;
                PyErr_Fetch(&type, &value, &tb);
                const char *text = value ? PyUnicode_AsUTF8(value) : NULL;
                if (text && strncmp(text, "truncated: a varint", 19) == 0) {
                    Py_XDECREF(type); Py_XDECREF(value); Py_XDECREF(tb);
                    return fail("truncated: a packed varint runs past the end of its field");
                }
                PyErr_Restore(type, value, tb);
            }
            return -1;
        }
        unsigned char out[8];
        Py_ssize_t size = 8;
        if (as_int32) {
            int64_t s = (int64_t)x;
            if (s < INT32_MIN || s > INT32_MAX) {
                PyErr_Format(PyExc_ValueError, "feature %R: an int32 value out of the int32 range", name);
                return -1;
            }
            uint32_t u = (uint32_t)(int32_t)s;
            for (int i = 0; i < 4; i++) out[i] = (unsigned char)(u >> (8 * i));
            size = 4;
        } else {
            for (int i = 0; i < 8; i++) out[i] = (unsigned char)(x >> (8 * i));
        }
        Py_ssize_t old = PyByteArray_GET_SIZE(buf);
        if (PyByteArray_Resize(buf, old + size) < 0) {
            return -1;
        }
        memcpy(PyByteArray_AS_STRING(buf) + old, out, (size_t)size);
    }
    return 0;
}

static int append_raw(PyObject *buf, span v) {
    Py_ssize_t old = PyByteArray_GET_SIZE(buf), n = (Py_ssize_t)(v.end - v.p);
    if (PyByteArray_Resize(buf, old + n) < 0) {
        return -1;
    }
    memcpy(PyByteArray_AS_STRING(buf) + old, v.p, (size_t)n);
    return 0;
}

static const char *tensor_name(int kind) {
    return kind == 2 ? "float32_tensor" : kind == 3 ? "float64_tensor" : "int32_tensor";
}

/* A Float32/Float64/Int32Tensor -> (values, keys or None, shape or None). */
static PyObject *tensor(span t, int kind, PyObject *name) {
    PyObject *values = PyByteArray_FromStringAndSize(NULL, 0), *keys = NULL, *shape = NULL, *result = NULL;
    Py_ssize_t itemsize = kind == 3 ? 8 : 4;
    if (values == NULL) {
        return NULL;
    }
    while (t.p < t.end) {
        uint64_t number;
        int wire;
        span v;
        if (next_field(&t, &number, &wire, &v) < 0) {
            goto done;
        }
        if (number == 1) {
            if (kind == 7) {
                if (wire != 0 && wire != 2) {
                    PyErr_Format(PyExc_ValueError, "feature %R: values of wire type %d in an int32_tensor",
                                 name, wire);
                    goto done;
                }
                if (append_varints(values, v, 1, name) < 0) goto done;
            } else if (wire == 2) {
                Py_ssize_t n = (Py_ssize_t)(v.end - v.p);
                if (n % itemsize) {
                    PyErr_Format(PyExc_ValueError, "feature %R: %zd bytes of packed %s values, not a multiple "
                                 "of %zd", name, n, kind == 2 ? "float32" : "float64", itemsize);
                    goto done;
                }
                if (append_raw(values, v) < 0) goto done;
            } else if (wire == (kind == 2 ? 5 : 1)) {
                if (append_raw(values, v) < 0) goto done;
            } else {
                PyErr_Format(PyExc_ValueError, "feature %R: values of wire type %d in a %s", name, wire,
                             tensor_name(kind));
                goto done;
            }
        } else if (number == 2 || number == 3) {
            if (wire != 0 && wire != 2) {
                PyErr_Format(PyExc_ValueError, "feature %R: %s of wire type %d", name,
                             number == 2 ? "keys" : "shape", wire);
                goto done;
            }
            PyObject **target = number == 2 ? &keys : &shape;
            if (*target == NULL && (*target = PyByteArray_FromStringAndSize(NULL, 0)) == NULL) goto done;
            if (append_varints(*target, v, 0, name) < 0) goto done;
        }
    }
    PyObject *shape_tuple = Py_None;
    Py_INCREF(Py_None);
    if (shape != NULL) {
        Py_ssize_t rank = PyByteArray_GET_SIZE(shape) / 8;
        if (rank > 32) {
            Py_DECREF(shape_tuple);
            PyErr_Format(PyExc_ValueError, "feature %R: a shape of %zd dimensions (at most 32)", name, rank);
            goto done;
        }
        Py_DECREF(shape_tuple);
        shape_tuple = PyTuple_New(rank);
        if (shape_tuple == NULL) goto done;
        const unsigned char *b = (const unsigned char *)PyByteArray_AS_STRING(shape);
        for (Py_ssize_t i = 0; i < rank; i++) {
            uint64_t d = 0;
            for (int j = 0; j < 8; j++) d |= (uint64_t)b[8 * i + j] << (8 * j);
            PyObject *dim = PyLong_FromUnsignedLongLong((unsigned long long)d);
            if (dim == NULL) {
                Py_DECREF(shape_tuple);
                goto done;
            }
            PyTuple_SET_ITEM(shape_tuple, i, dim);
        }
    }
    result = Py_BuildValue("(OOO)", values, keys ? keys : Py_None, shape_tuple);
    Py_DECREF(shape_tuple);
done:
    Py_XDECREF(values);
    Py_XDECREF(keys);
    Py_XDECREF(shape);
    return result;
}

/* A Value -> (kind, values, keys, shape). */
static PyObject *value(span v, PyObject *name) {
    PyObject *found = NULL;
    while (v.p < v.end) {
        uint64_t number;
        int wire;
        span f;
        if (next_field(&v, &number, &wire, &f) < 0) {
            Py_XDECREF(found);
            return NULL;
        }
        if (wire != 2) {
            continue;
        }
        PyObject *item = NULL;
        if (number == 2 || number == 3 || number == 7) {
            PyObject *t = tensor(f, (int)number, name);
            if (t == NULL) {
                Py_XDECREF(found);
                return NULL;
            }
            item = Py_BuildValue("(iOOO)", (int)number, PyTuple_GET_ITEM(t, 0), PyTuple_GET_ITEM(t, 1),
                                 PyTuple_GET_ITEM(t, 2));
            Py_DECREF(t);
        } else if (number == 9) {
            PyObject *items = PyList_New(0);
            if (items == NULL) {
                Py_XDECREF(found);
                return NULL;
            }
            while (f.p < f.end) {
                uint64_t n2;
                int w2;
                span b;
                if (next_field(&f, &n2, &w2, &b) < 0) {
                    Py_DECREF(items);
                    Py_XDECREF(found);
                    return NULL;
                }
                if (n2 == 1 && w2 == 2) {
                    PyObject *bytes = PyBytes_FromStringAndSize((const char *)b.p, (Py_ssize_t)(b.end - b.p));
                    if (bytes == NULL || PyList_Append(items, bytes) < 0) {
                        Py_XDECREF(bytes);
                        Py_DECREF(items);
                        Py_XDECREF(found);
                        return NULL;
                    }
                    Py_DECREF(bytes);
                }
            }
            item = Py_BuildValue("(iOOO)", 9, items, Py_None, Py_None);
            Py_DECREF(items);
        } else {
            continue;
        }
        if (item == NULL) {
            Py_XDECREF(found);
            return NULL;
        }
        Py_XDECREF(found);
        found = item;  /* a oneof: the last member given wins, as protobuf parses it */
    }
    if (found == NULL) {
        PyErr_Format(PyExc_ValueError, "feature %R: a Value with none of float32_tensor, float64_tensor, "
                     "int32_tensor, bytes", name);
    }
    return found;
}

/* A map entry (key = 1, value = 2) -> (name, kind, values, keys, shape). */
static PyObject *entry(span e, int label) {
    PyObject *name = NULL, *result = NULL;
    span value_span = {NULL, NULL};
    int have_value = 0;
    while (e.p < e.end) {
        uint64_t number;
        int wire;
        span f;
        if (next_field(&e, &number, &wire, &f) < 0) {
            Py_XDECREF(name);
            return NULL;
        }
        if (number == 1 && wire == 2) {
            Py_XDECREF(name);
            name = utf8(f, label ? "a label name" : "a feature name");
            if (name == NULL) {
                return NULL;
            }
        } else if (number == 2 && wire == 2) {
            value_span = f;
            have_value = 1;
        }
    }
    if (name == NULL && (name = PyUnicode_FromString("")) == NULL) {
        return NULL;
    }
    if (!have_value) {
        PyErr_Format(PyExc_ValueError, "%s %R has no value", label ? "label" : "feature", name);
        Py_DECREF(name);
        return NULL;
    }
    PyObject *shown = label ? PyUnicode_FromFormat("label_%U", name) : (Py_INCREF(name), name);
    if (shown == NULL) {
        Py_DECREF(name);
        return NULL;
    }
    PyObject *v = value(value_span, shown);
    Py_DECREF(shown);
    if (v != NULL) {
        result = Py_BuildValue("(OOOOO)", name, PyTuple_GET_ITEM(v, 0), PyTuple_GET_ITEM(v, 1),
                               PyTuple_GET_ITEM(v, 2), PyTuple_GET_ITEM(v, 3));
        Py_DECREF(v);
    }
    Py_DECREF(name);
    return result;
}

static PyObject *parse(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data)) {
        return NULL;
    }
    static const char *string_names[] = {"uid", "metadata", "configuration"};
    PyObject *features = PyList_New(0), *label = PyList_New(0), *strings = PyDict_New(), *result = NULL;
    span s = {(const unsigned char *)data.buf, (const unsigned char *)data.buf + data.len};
    if (features == NULL || label == NULL || strings == NULL) goto done;
    while (s.p < s.end) {
        uint64_t number;
        int wire;
        span f;
        if (next_field(&s, &number, &wire, &f) < 0) goto done;
        if (wire != 2) {
            continue;
        }
        if (number == 1 || number == 2) {
            PyObject *e = entry(f, number == 2);
            if (e == NULL || PyList_Append(number == 1 ? features : label, e) < 0) {
                Py_XDECREF(e);
                goto done;
            }
            Py_DECREF(e);
        } else if (number >= 3 && number <= 5) {
            PyObject *text = utf8(f, string_names[number - 3]);
            if (text == NULL || PyDict_SetItemString(strings, string_names[number - 3], text) < 0) {
                Py_XDECREF(text);
                goto done;
            }
            Py_DECREF(text);
        }
    }
    result = Py_BuildValue("(OOO)", features, label, strings);
done:
    Py_XDECREF(features);
    Py_XDECREF(label);
    Py_XDECREF(strings);
    PyBuffer_Release(&data);
    return result;
}

static PyMethodDef methods[] = {
    {"parse", parse, METH_VARARGS,
     "parse(data) -> (features, label, strings): one aialgs.data.Record's wire format (see the source)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_protobuf", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__protobuf(void) {
    return PyModule_Create(&module);
}
