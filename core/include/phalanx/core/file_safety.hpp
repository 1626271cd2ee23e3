#pragma once
// How Phalanx opens files, so that a file or folder planted by another local user cannot
// redirect a write or stall a read (docs/reliability.md, "Files the project creates"):
// files it creates are never opened through a symbolic link and are created exclusively;
// checkpoint and cache files are private (0600 in 0700 folders, 0644 in 0755 with
// PHALANX_FILE_MODE=0644); folders it writes into must belong to this user and not be
// writable by others (unless sticky, as /tmp is); data it reads must be a regular file.
// Every function throws IoError with a one-line message naming the path.
#include <cstddef>
#include <string>

namespace phalanx::files {

/// What a st_mode is, in words: "a regular file", "a directory", "a FIFO", "a character
/// device", "a block device", "a socket", "a symbolic link".
std::string kind_of(unsigned mode);

/// Opens an existing file for reading. A symbolic link to one is followed (data is often
/// linked), but the file must be regular: a FIFO, a device or a directory is refused as
/// "PATH: is a FIFO, not a regular file" (a FIFO is opened without waiting for a writer).
/// Returns a blocking, close-on-exec descriptor; `size` gets the file's size.
int open_regular(const std::string& path, std::size_t* size = nullptr);
/// The same checks without keeping the file open (for inputs checked before they are read).
void check_regular(const std::string& path);

/// The mode of new checkpoint and cache files: 0600, or 0644 with PHALANX_FILE_MODE=0644
/// (any other value is a ConfigError naming the variable).
unsigned private_file_mode();
/// The mode of the folders made for them: 0700 (0755 with PHALANX_FILE_MODE=0644).
unsigned private_folder_mode();

/// Creates `path`, which must not exist: an existing name (a file, or a symbolic link even
/// if it dangles) is refused, never followed or truncated. `mode` is reduced by the umask.
int create_new(const std::string& path, unsigned mode);
/// Creates a new file named `base` + ".tmp." + six random characters, as create_new does;
/// `tmp` gets its name. For a file written whole, then renamed onto `base`.
int create_temp(const std::string& base, unsigned mode, std::string& tmp);
/// Opens a file the user named for output (a log, metrics, a chart) for writing: created
/// (with `mode`) when missing, truncated (a regular file) or appended to. A symbolic link is
/// followed only when this user or root owns it (/dev/stdout): one planted by another user
/// is refused. A character device or a FIFO with a reader is written to; a directory, a
/// block device or a socket is refused.
int open_output(const std::string& path, bool append, unsigned mode = 0666);
/// "/proc/self/fd/N": opening it reopens the very file `fd` refers to, whatever its name
/// now names (a stream checked through a descriptor, then opened, cannot be redirected).
std::string fd_path(int fd);
/// Opens, creating when missing, a lock file that every run reuses: never through a
/// symbolic link, and only a regular file of this user with no other name (hard link).
int open_lock_file(const std::string& path, unsigned mode);

/// Makes `dir` and its missing parents with `mode`; `what` names it in errors ("checkpoint
/// folder"). An existing `dir` is left as it is (check it with check_private_folder).
void make_folders(const std::string& dir, unsigned mode, const std::string& what);
/// Why this user must not write into `dir`, or "" when it may: a folder of another user, or
/// one that its group or others may write without the sticky bit, where another user could
/// plant or swap files. The reason is one line ending with what to do.
std::string folder_refusal(const std::string& dir, const std::string& what);
/// Throws IoError with folder_refusal's reason when there is one.
void check_private_folder(const std::string& dir, const std::string& what);

}  // namespace phalanx::files
