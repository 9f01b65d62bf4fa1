/* The common case of FrameParser._parse_into, compiled: whole STOMP frames with LF line ends, a
 * content-length of at most 9 digits (or none) and heads within the limits.  Anything else (a CR,
 * an unfinished frame, a head over a limit, a bad content-length or a missing NUL) stops the split
 * where that frame starts, and the Python parser goes on from there: it alone decides errors and
 * keeps the state of unfinished frames, so what is accepted never depends on this module.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static const char CLEN[] = "\ncontent-length:";
#define CLEN_SIZE (sizeof(CLEN) - 1)

/* split(buf, pos, frames, head_limit, max_headers, max_frame) -> (pos, heart-beats)
 * Appends (head, body) bytes pairs to the list ``frames``; returns the offset of the first byte
 * not taken and the number of EOLs skipped between frames. */
static PyObject *
split(PyObject *self, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos, head_limit, max_headers, max_frame;
    PyObject *frames;
    if (!PyArg_ParseTuple(args, "y*nO!nnn", &view, &pos, &PyList_Type, &frames, &head_limit,
                          &max_headers, &max_frame))
        return NULL;
    const char *buf = view.buf;
    const Py_ssize_t n = view.len;
    Py_ssize_t beats = 0;
    if (pos < 0 || pos > n)
        pos = n;
    for (;;) {
        while (pos < n && buf[pos] == '\n') {
            pos++;
            beats++;
        }
        if (pos >= n || buf[pos] == '\r')
            break;
        const Py_ssize_t start = pos;
        const char *blank = memmem(buf + start, n - start, "\n\n", 2);
        if (blank == NULL)
            break;
        const Py_ssize_t e = blank - buf; /* the head is [start, e) */
        const Py_ssize_t hlen = e - start;
        const char *head = buf + start;
        if (hlen >= head_limit || memchr(head, '\0', hlen) || memchr(head, '\r', hlen))
            break;
        if (hlen > max_headers) {
            Py_ssize_t lines = 0;
            for (const char *p = head; (p = memchr(p, '\n', head + hlen - p)) != NULL; p++)
                lines++;
            if (lines > max_headers)
                break;
        }
        Py_ssize_t clen = -1;
        const char *k = memmem(head, hlen, CLEN, CLEN_SIZE);
        if (k != NULL) {
            const char *v = k + CLEN_SIZE, *stop = head + hlen;
            const char *nl = memchr(v, '\n', stop - v);
            if (nl != NULL)
                stop = nl;
            if (stop - v < 1 || stop - v > 9)
                break;
            clen = 0;
            for (const char *p = v; p < stop; p++) {
                if (*p < '0' || *p > '9') {
                    clen = -1;
                    break;
                }
                clen = clen * 10 + (*p - '0');
            }
            if (clen < 0 || clen > max_frame)
                break;
        }
        const Py_ssize_t b = e + 2; /* the body's first byte */
        Py_ssize_t end;
        if (clen >= 0) {
            if (b - start + clen > max_frame)
                break;
            end = b + clen;
            if (end >= n || buf[end] != '\0')
                break;
        } else {
            const char *nul = memchr(buf + b, '\0', n - b);
            if (nul == NULL)
                break;
            end = nul - buf;
            if (end - start > max_frame)
                break;
        }
        PyObject *frame = Py_BuildValue("(y#y#)", head, hlen, buf + b, end - b);
        if (frame == NULL || PyList_Append(frames, frame) < 0) {
            Py_XDECREF(frame);
            PyBuffer_Release(&view);
            return NULL;
        }
        Py_DECREF(frame);
        pos = end + 1;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(nn)", pos, beats);
}

static PyMethodDef methods[] = {
    {"split", split, METH_VARARGS, "split(buf, pos, frames, head_limit, max_headers, max_frame) -> (pos, heart-beats)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_framesplit", "The common case of STOMP frame splitting, compiled.", -1, methods,
};

PyMODINIT_FUNC
PyInit__framesplit(void)
{
    return PyModule_Create(&module);
}
