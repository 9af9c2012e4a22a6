/* File-system helpers shared by the launcher and libmg. */
#ifndef MG_FS_H
#define MG_FS_H

/* mkdir -p with mode for the directories it creates: 0, or a negative code
 * (-ENOTDIR when path exists and is not a directory, -ENAMETOOLONG). */
int mg_mkdir_p(const char *path, int mode);

/* path opened for reading when it is a regular file: a file descriptor, or
 * a negative code (-MG_EFORMAT when it is a FIFO, a device, a directory).
 * A FIFO put where a log or a record belongs never blocks the reader (the
 * open does not wait for a writer), and a device is never read. */
int mg_open_regular(const char *path);

#endif
