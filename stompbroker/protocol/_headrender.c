/* A MESSAGE's shared part (model.Message.shared), compiled, for a message whose headers are its own
 * (a rendering the block table cannot keep). The message-id, the destination and every name and
 * value must be exactly a str; anything else returns None and Python renders it, so the bytes never
 * depend on this module (tests/unit/test_headrender.py compares the two). The headers are a dict, `skip` a
 * set of names; anything else also goes to Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* Bytes `s` takes once escaped: STOMP 1.1+ (`escaped`) turns \ CR LF : into two bytes each; 1.0 has
 * no escaping and turns CR and LF into a space. */
static Py_ssize_t
escaped_size(const char *s, Py_ssize_t n, int escaped)
{
    Py_ssize_t size = n;
    if (escaped)
        for (Py_ssize_t i = 0; i < n; i++)
            size += (s[i] == '\\' || s[i] == '\r' || s[i] == '\n' || s[i] == ':');
    return size;
}

static char *
put(char *out, const char *s, Py_ssize_t n, int escaped)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '\\' || c == '\r' || c == '\n' || c == ':') {
            if (!escaped) {
                *out++ = (c == '\r' || c == '\n') ? ' ' : c;
                continue;
            }
            *out++ = '\\';
            *out++ = c == '\\' ? '\\' : c == '\r' ? 'r' : c == '\n' ? 'n' : 'c';
        } else {
            *out++ = c;
        }
    }
    return out;
}

/* The UTF-8 of a str, or NULL (not exactly a str, or not encodable: Python then does what it does).
 * Exact strs only: a subclass's __hash__ or __eq__ could run Python code between the sizing pass
 * and the writing pass below, and change what the second one writes. */
static const char *
utf8(PyObject *s, Py_ssize_t *n)
{
    if (!PyUnicode_CheckExact(s))
        return NULL;
    const char *u = PyUnicode_AsUTF8AndSize(s, n);
    if (u == NULL)
        PyErr_Clear();
    return u;
}

/* part(message_id, destination, headers, skip, body, escaped) -> bytes, or None: a MESSAGE after
 * its command line and subscription header (model.Message.shared). "message-id:", then
 * "destination:", then a line per header whose name is not in `skip`, in the dict's order, then
 * content-length, the blank line, the body and the NUL. */
static PyObject *
part(PyObject *self, PyObject *args)
{
    PyObject *message_id, *destination, *headers, *skip, *body_object;
    Py_buffer body;
    int escaped;
    if (!PyArg_ParseTuple(args, "OOOOOp", &message_id, &destination, &headers, &skip, &body_object, &escaped))
        return NULL;
    if (!PyDict_Check(headers) || !PyAnySet_Check(skip) || PyObject_GetBuffer(body_object, &body, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *result = NULL;
    Py_ssize_t in, dn, nn, vn, pos = 0;
    PyObject *name, *value;
    const char *id = utf8(message_id, &in), *d = utf8(destination, &dn), *ns, *vs;
    char length[48];
    int ln = snprintf(length, sizeof length, "\ncontent-length:%zd\n\n", body.len);
    if (id == NULL || d == NULL)
        goto fallback;
    Py_ssize_t size = 11 + escaped_size(id, in, escaped) + 13 + escaped_size(d, dn, escaped) + ln + body.len + 1;
    while (PyDict_Next(headers, &pos, &name, &value)) {
        if (!PyUnicode_CheckExact(name))
            goto fallback;
        int skipped = PySet_Contains(skip, name);
        if (skipped < 0)
            goto done;
        if (skipped)
            continue;
        if ((ns = utf8(name, &nn)) == NULL || (vs = utf8(value, &vn)) == NULL)
            goto fallback;
        size += 2 + escaped_size(ns, nn, escaped) + escaped_size(vs, vn, escaped);
    }
    result = PyBytes_FromStringAndSize(NULL, size);
    if (result == NULL)
        goto done;
    char *out = PyBytes_AS_STRING(result);
    memcpy(out, "message-id:", 11);
    out = put(out + 11, id, in, escaped);
    memcpy(out, "\ndestination:", 13);
    out = put(out + 13, d, dn, escaped);
    pos = 0;
    while (PyDict_Next(headers, &pos, &name, &value)) {
        if (PySet_Contains(skip, name))
            continue;
        ns = PyUnicode_AsUTF8AndSize(name, &nn);   /* (cached by the first pass) */
        vs = PyUnicode_AsUTF8AndSize(value, &vn);
        *out++ = '\n';
        out = put(out, ns, nn, escaped);
        *out++ = ':';
        out = put(out, vs, vn, escaped);
    }
    memcpy(out, length, ln);
    memcpy(out + ln, body.buf, body.len);
    out[ln + body.len] = '\0';
    goto done;
fallback:
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&body);
    return result;
}

static PyMethodDef methods[] = {
    {"part", part, METH_VARARGS,
     "part(message_id, destination, headers, skip, body, escaped) -> a MESSAGE after its subscription header, "
     "or None: leave it to Python"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_headrender", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__headrender(void)
{
    return PyModule_Create(&module);
}
