/* The common case of stomp.parse_head, compiled: a head of valid UTF-8 whose header lines all have
 * a name and a colon, with nothing to unescape.  Anything else (invalid UTF-8, a line without a
 * name or a colon, a backslash where escapes count) returns None and the Python parse_head decides,
 * so what is accepted, and every error, never depends on this module.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* The names nearly every head has, made once: their hashes are cached, and every message's headers
 * share the same name objects. */
static const char *const KNOWN[] = {"destination", "content-length", "content-type", "receipt", "id", "ack",
                                    "subscription", "message-id", "persistent", "transaction", "host",
                                    "accept-version", "heart-beat", "login", "passcode", "priority",
                                    "expires", "selector", "durable", "redelivered"};
#define NKNOWN (sizeof(KNOWN) / sizeof(KNOWN[0]))
static PyObject *known[NKNOWN];
static Py_ssize_t known_len[NKNOWN];

static PyObject *
name_of(const char *s, Py_ssize_t len)
{
    for (size_t i = 0; i < NKNOWN; i++) {
        if (known_len[i] == len && memcmp(KNOWN[i], s, len) == 0) {
            Py_INCREF(known[i]);
            return known[i];
        }
    }
    return PyUnicode_DecodeUTF8(s, len, NULL);
}

/* parse(head, unescape) -> (command, headers) or None: see the top of this file. The first
 * occurrence of a header wins. */
static PyObject *
parse(PyObject *self, PyObject *args)
{
    Py_buffer view;
    int unescape;
    if (!PyArg_ParseTuple(args, "y*p", &view, &unescape))
        return NULL;
    const char *buf = view.buf, *end = buf + view.len;
    PyObject *command = NULL, *headers = NULL, *result = NULL;
    if (unescape && memchr(buf, '\\', view.len) != NULL)
        goto fallback;
    const char *nl = memchr(buf, '\n', view.len);
    const char *line_end = nl ? nl : end;
    command = PyUnicode_DecodeUTF8(buf, line_end - buf, NULL);
    if (command == NULL)
        goto fallback;
    headers = PyDict_New();
    if (headers == NULL)
        goto done;
    while (nl != NULL) {
        const char *line = nl + 1;
        nl = memchr(line, '\n', end - line);
        line_end = nl ? nl : end;
        const char *colon = memchr(line, ':', line_end - line);
        if (colon == NULL || colon == line)
            goto fallback;
        PyObject *name = name_of(line, colon - line);
        if (name == NULL)
            goto fallback;
        int has = PyDict_Contains(headers, name);
        if (has != 0) {
            Py_DECREF(name);
            if (has < 0)
                goto done;
            /* (a repeated header's value must still be valid UTF-8: Python decodes the whole head) */
            PyObject *value = PyUnicode_DecodeUTF8(colon + 1, line_end - colon - 1, NULL);
            if (value == NULL)
                goto fallback;
            Py_DECREF(value);
            continue;
        }
        PyObject *value = PyUnicode_DecodeUTF8(colon + 1, line_end - colon - 1, NULL);
        if (value == NULL) {
            Py_DECREF(name);
            goto fallback;
        }
        int failed = PyDict_SetItem(headers, name, value);
        Py_DECREF(name);
        Py_DECREF(value);
        if (failed)
            goto done;
    }
    result = PyTuple_Pack(2, command, headers);
    goto done;
fallback:
    /* (a decoding error is not this function's to report: Python's parse_head says what is wrong) */
    if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
        PyErr_Clear();
    if (!PyErr_Occurred()) {
        Py_INCREF(Py_None);
        result = Py_None;
    }
done:
    Py_XDECREF(command);
    Py_XDECREF(headers);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"parse", parse, METH_VARARGS, "parse(head, unescape) -> (command, headers), or None: leave it to Python"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_headparse", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__headparse(void)
{
    for (size_t i = 0; i < NKNOWN; i++) {
        known_len[i] = (Py_ssize_t)strlen(KNOWN[i]);
        known[i] = PyUnicode_InternFromString(KNOWN[i]);
        if (known[i] == NULL)
            return NULL;
    }
    return PyModule_Create(&module);
}
