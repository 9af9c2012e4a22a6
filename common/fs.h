/* File-system helpers shared by the launcher and libmg. */
#ifndef MG_FS_H
#define MG_FS_H

/* mkdir -p with mode for the directories it creates: 0, or a negative code
 * (-ENOTDIR when path exists and is not a directory, -ENAMETOOLONG). */
int mg_mkdir_p(const char *path, int mode);

#endif
