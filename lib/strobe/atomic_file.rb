# frozen_string_literal: true

require "fcntl"
require "securerandom"

module Strobe
  # Writes a file whole or not at all, safely even in a directory other
  # users can write to (/tmp, a shared profiles directory):
  #
  #   AtomicFile.write("tmp/profile.json") { |io| io.write(data) }
  #
  # What the block writes goes to a new file next to the target, named
  # ".NAME.strobe-RANDOM.tmp" (128 random bits from SecureRandom, so that
  # nobody can plant a file or a symlink by that name in advance) and
  # created exclusively (O_CREAT | O_EXCL, and O_NOFOLLOW where there is
  # one): an existing file or symlink of that name is never opened, let
  # alone written through; another name is tried instead. The temporary
  # file is readable by its owner only while it is written, and stays so
  # (0600) unless the operator sets STROBE_FILE_MODE (octal permission bits,
  # e.g. 640, less the umask): a profile may hold what clients sent (the
  # paths in request markers) and the shapes of the program's queries,
  # which nobody else on the machine is to read unless the operator asks.
  # It is then renamed over the target, which replaces what was there (a symlink
  # itself, not what it points to). Each write has a file of its own, so
  # threads and processes writing one target at once do not mix their data:
  # the last rename wins, whole.
  #
  # On any failure, the block's included, the temporary file is removed and
  # the error raised; the target is left as it was.
  #
  # What is at the target is decided on the descriptor, not on path
  # look-ups another user could change in between. The target is opened
  # for writing without creating it, waiting or taking a terminal
  # (O_WRONLY | O_NONBLOCK | O_NOCTTY), and without following a symlink
  # (O_NOFOLLOW) when its directory is untrusted: writable by everyone, or
  # by a group other than root's and this process's, or owned by neither
  # this process's user nor root. The directory is opened first and judged
  # by its descriptor, and the target opened, created and renamed through
  # it (/proc/self/fd/N/NAME), so swapping a directory on the path in
  # between changes nothing. The directory itself is reached one name at a
  # time through descriptors, and a symlink on the way is followed only in
  # a trusted directory, or in a sticky one (/tmp) when it is this
  # process's user's or root's: another user's link is Refused (it would
  # choose where the profile goes). Then fstat says:
  # - nothing there (ENOENT), a symlink in an untrusted directory (ELOOP),
  #   or a regular file: it is replaced by the rename above;
  # - a FIFO, character device or socket of this process's user or root
  #   (/dev/null, /dev/stdout, /dev/fd/N, a named pipe of one's own) is
  #   written in place: a rename would replace the device with a regular
  #   file (as root, /dev/stdout itself);
  # - one of another user's, wherever it lies, is refused (Refused, naming
  #   the path, its type and its owner): they may have put it there to read
  #   the profile or to make the save wait for good;
  # - a block device is refused.
  # A descriptor this process holds, named /dev/stdout, /dev/stderr,
  # /dev/fd/N or /proc/self/fd/N, is the operator's to hand over: it is
  # written through (a duplicate of it, sharing its offset), whoever owns
  # what it reaches (`sudo strobe report -o /dev/stdout | less`: the user's
  # pipe) and whatever it is (`> out.txt`: never renamed over, which as
  # root replaced the system's /dev/stdout symlink).
  # A FIFO no process reads, or a socket (open(2) opens none), is an error
  # (Unread; Refused if another user's), not a wait for a reader.
  # Once open, a special file is written as any descriptor is (blocking
  # again): a reader of the operator's that stops reading holds the save,
  # as with any pipe.
  module AtomicFile
    # A target not written, for a reason its message gives after the path
    # (#reason: the reason alone, for callers that name the path already).
    module TargetError
      attr_reader :reason

      def initialize(path, reason)
        @reason = reason
        super("#{path}: #{reason}")
      end
    end

    # A device or FIFO someone else may have planted (see above).
    class Refused < Errno::EPERM
      include TargetError
    end

    # A FIFO without a reader, or a socket (which open(2) cannot open).
    class Unread < Errno::ENXIO
      include TargetError
    end

    FLAGS = File::WRONLY | File::CREAT | File::EXCL | (defined?(File::NOFOLLOW) ? File::NOFOLLOW : 0)
    # Random names tried before giving up: one is taken only if someone
    # else created it, so running out means names are being planted.
    ATTEMPTS = 5
    # Characters of the target's name kept in the temporary name, which
    # stays under the 255 bytes a file name may have.
    NAME_CHARS = 40

    module_function

    # Yields a binary IO on a new temporary file, then renames it to path (a
    # String or anything with #to_path). Returns path as a String.
    def write(path, &block)
      path = path.respond_to?(:to_path) ? path.to_path : path.to_s
      held = held(path)
      return write_in_place(path, held, &block) if held

      dir_path, name = File.split(path)
      dir = open_directory(dir_path, path)
      begin
        file = special(path, dir, name)
        return write_in_place(path, file, &block) if file

        write_renamed(path, dir, name, &block)
      ensure
        dir.close
      end
    rescue SystemCallError => e
      # (named by the caller's path, not the one through /proc)
      raise if e.is_a?(TargetError) || !e.message.include?("/proc/self/fd/")

      raise e.class, path
    end

    # Writes a new file in dir (open) and renames it to name there.
    def write_renamed(path, dir, name)
      file, temp = create(dir, name, path)
      done = false
      begin
        yield file
        file.chmod(new_file_mode)
        file.close
        File.rename(inside(dir, temp), inside(dir, name))
        done = true
      ensure
        discard(file, inside(dir, temp)) unless done
      end
      path
    end

    # The path of name in dir (an open directory) through its descriptor,
    # so that what the path leads to cannot change under it.
    def inside(dir, name)
      PROC_FD ? "/proc/self/fd/#{dir.fileno}/#{name}" : File.join(dir.path, name)
    end

    PROC_FD = File.directory?("/proc/self/fd")
    # Symlinks followed on the way to a target's directory, at most (as
    # Linux does).
    MAX_LINKS = 40
    DIR_OPEN = File::RDONLY | File::NONBLOCK | (defined?(File::NOCTTY) ? File::NOCTTY : 0)

    # The directory dir_path (the target path's), open, reached one name at
    # a time from "/" or the working directory through descriptors: a
    # symlink on the way is followed only where no one else can have put
    # it, in a trusted directory (see below), or in a sticky one (/tmp)
    # when it is this process's user's or root's. Another's is Refused: it
    # would choose where the profile goes (or, renamed over, what it
    # replaces).
    def open_directory(dir_path, path)
      return File.open(dir_path, File::RDONLY) unless PROC_FD

      dir = File.open(dir_path.start_with?("/") ? "/" : ".", DIR_OPEN)
      names = dir_path.split("/")
      links = 0
      until names.empty?
        name = names.shift
        next if name.empty? || name == "."

        below = open_below(dir, name)
        if below
          dir.close
          dir = below
          next
        end
        raise Errno::ELOOP, path if (links += 1) > MAX_LINKS

        target = follow(dir, name, path)
        if target.start_with?("/")
          dir.close
          dir = File.open("/", DIR_OPEN)
        end
        names = target.split("/") + names
      end
      dir
    rescue StandardError
      dir&.close
      raise
    end

    # The directory name in dir, open; nil when it is a symlink. Raises
    # ENOTDIR for anything else.
    def open_below(dir, name)
      below = File.open(inside(dir, name), DIR_OPEN | NOFOLLOW)
      return below if below.stat.directory?

      below.close
      raise Errno::ENOTDIR, name
    rescue Errno::ELOOP
      nil
    end

    # Where the symlink name in dir leads, if it is one to follow (see
    # open_directory); raises Refused otherwise.
    def follow(dir, name, path)
      through = inside(dir, name)
      link = File.lstat(through)
      stat = dir.stat
      ours = link.uid == Process.euid || link.uid.zero?
      unless trusted_directory?(stat) || (stat.sticky? && ours)
        raise Refused.new(path, "#{name} is a symlink of uid #{link.uid}'s in a directory other users may change " \
                                "(mode #{format('%o', stat.mode & 0o7777)}): not followed")
      end
      File.readlink(through)
    end

    OPEN = File::WRONLY | File::NONBLOCK | (defined?(File::NOCTTY) ? File::NOCTTY : 0)
    NOFOLLOW = defined?(File::NOFOLLOW) ? File::NOFOLLOW : 0
    # What a target that is absent, a symlink not to follow, or not ours to
    # open is: one the rename replaces (or fails on, with its own error).
    RENAMED = [Errno::ENOENT, Errno::ELOOP, Errno::ENOTDIR, Errno::EACCES, Errno::EISDIR, Errno::ETXTBSY].freeze

    # The device, FIFO or socket at path, open for writing, blocking again
    # (see above); nil for what the rename is to replace. Raises Refused or
    # Unread for what is not to be written.
    def special(path, dir, name)
      file = open_in_directory(path, dir, name)
      return nil unless file
      begin
        stat = file.stat
        return file.close if stat.file?

        refuse(path, stat)
        file.fcntl(Fcntl::F_SETFL, file.fcntl(Fcntl::F_GETFL) & ~File::NONBLOCK)
        file
      rescue StandardError
        file.close
        raise
      end
    end

    # The target name in dir opened as above, or nil for what the rename
    # replaces. The directory was opened first
    # (open_directory), is judged by its descriptor, and the target opened
    # through that descriptor (/proc/self/fd/N/NAME): another user swapping
    # a directory on the path between the judging and the opening changes
    # neither.
    def open_in_directory(path, dir, name)
      trusted = trusted_directory?(dir.stat)
      File.new(inside(dir, name), OPEN | (trusted ? 0 : NOFOLLOW), binmode: true)
    rescue Errno::ENXIO
      raise unread(path, trusted)
    rescue *RENAMED
      nil
    end

    HELD = %r{\A/(?:dev/(?:(stdout)|(stderr)|fd/(\d+))|proc/(?:self|(\d+))/fd/(\d+))\z}

    # A duplicate of the descriptor path names, if it is one this process
    # holds (see above), for writing; nil otherwise. What Ruby buffered
    # for it is written first.
    def held(path)
      match = HELD.match(File.expand_path(path).squeeze("/"))
      return nil if match.nil? || (match[4] && match[4].to_i != Process.pid)

      fd = match[1] ? 1 : match[2] ? 2 : (match[3] || match[5]).to_i
      [$stdout, $stderr, STDOUT, STDERR].each { |io| io.flush if io.respond_to?(:fileno) && !io.closed? && io.fileno == fd }
      IO.for_fd(fd, autoclose: false).dup.tap(&:binmode)
    rescue Errno::EBADF
      raise Errno::EBADF, "#{path}: not a descriptor this process has open"
    end

    # Where another user cannot have put the target: a directory (its
    # File::Stat) owned by this process's user or root, writable by no one
    # else but, at most, root's group or this process's.
    def trusted_directory?(stat)
      return false unless stat.directory? && (stat.uid == Process.euid || stat.uid.zero?)
      return false if stat.world_writable?

      (stat.mode & 0o020).zero? || stat.gid.zero? || stat.gid == Process.egid
    end

    KINDS = { "fifo" => "FIFO", "characterSpecial" => "character device", "blockSpecial" => "block device",
              "socket" => "socket" }.freeze

    # Raises Refused unless stat (an open special file's) is a FIFO, a
    # character device or a socket of this process's user or root.
    def refuse(path, stat)
      kind = KINDS.fetch(stat.ftype, stat.ftype)
      raise Refused.new(path, "a #{kind}: not written") if stat.blockdev?
      return if stat.uid == Process.euid || stat.uid.zero?

      raise Refused.new(path, "a #{kind} of uid #{stat.uid}'s, neither this process's user nor root: not written " \
                              "(another user may have put it there)")
    end

    # The error for path, which open(2) found to be a FIFO no process reads
    # or a socket. Only which of the two, and whose, is looked up by path,
    # for the message: nothing is written either way.
    def unread(path, trusted)
      stat = trusted ? File.stat(path) : File.lstat(path)
      refuse(path, stat) if stat.pipe? || stat.socket?
      Unread.new(path, stat.socket? ? "a socket, not a file to write" : "a FIFO that no process is reading")
    rescue Refused => e # (an Errno::EPERM)
      e
    rescue SystemCallError
      Unread.new(path, "a FIFO that no process is reading")
    end

    # Writes the special file special opened, and closes it.
    def write_in_place(path, file)
      yield file
      path
    ensure
      file.close
    end

    # [a new file opened for writing, its name], in dir, next to name.
    def create(dir, name, path)
      ATTEMPTS.times do
        temp = temp_name(name)
        begin
          return [File.new(inside(dir, temp), FLAGS, 0o600, binmode: true), temp]
        rescue Errno::EEXIST, Errno::ELOOP
          next # someone else's file: left alone
        end
      end
      raise Errno::EEXIST, "#{path}: #{ATTEMPTS} random temporary names were all taken"
    end

    def temp_name(name)
      ".#{name[0, NAME_CHARS]}.strobe-#{SecureRandom.hex(16)}.tmp"
    end

    # The mode of a saved file: 0600, or STROBE_FILE_MODE's bits, less the
    # umask.
    def new_file_mode
      file_mode & ~umask
    end

    OWNER_ONLY = 0o600

    # STROBE_FILE_MODE as permission bits (octal digits, at most 0777; the
    # owner keeps read and write), else 0600, with one line on stderr for a
    # value that is not one.
    def file_mode
      setting = ENV["STROBE_FILE_MODE"]
      return OWNER_ONLY if setting.nil? || setting.empty?

      mode = Integer(setting, 8) if setting.match?(/\A0?[0-7]{3}\z/)
      return mode | OWNER_ONLY if mode

      unless @file_mode_warned == setting
        @file_mode_warned = setting
        $stderr.puts "strobe: STROBE_FILE_MODE must be octal permission bits such as 640, not #{setting[0, 20].inspect}: " \
                     "saving files readable by their owner only"
      end
      OWNER_ONLY
    end

    # The process's umask. Linux tells it in /proc/self/status; File.umask
    # reads it by setting it to 0 and back, and a file another thread
    # creates in between (one running outside the GVL) would get mode 0666.
    def umask
      line = File.foreach("/proc/self/status").find { |l| l.start_with?("Umask:") }
      line ? line.split.last.to_i(8) : File.umask
    rescue SystemCallError, IOError
      File.umask
    end

    # Closes and removes a temporary file that is not to be renamed; the
    # error that got us here is the one to raise, not one of these.
    def discard(file, temp)
      begin
        file.close unless file.closed?
      rescue IOError, SystemCallError
        nil
      end
      begin
        File.unlink(temp)
      rescue SystemCallError
        nil
      end
    end
  end
end
