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
  # A target that is not a regular file but a character device, a FIFO or a
  # socket (/dev/null, /dev/stdout, a named pipe someone reads) is written
  # in place instead: renaming over it would replace the device with a
  # regular file (as root, /dev/stdout itself). Through a symlink only if
  # the link's directory is not writable by everyone, where another user
  # could have planted it (such a link is replaced). Such a file is refused
  # (Refused) when it belongs to neither this process's user nor root and
  # lies in a directory anyone can write to (/tmp, /dev/shm): someone else
  # may have put it there, to read the profile or to make the save wait for
  # good. It is opened without waiting (O_NONBLOCK): a FIFO no process reads
  # is an error (Unread), not a wait for a reader. Once open, it is written
  # as any file descriptor is (blocking again): a reader of the operator's
  # that stops reading holds the save, as with any pipe. A block device is
  # refused.
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
      stat = special(path)
      return write_in_place(path, stat, &block) if stat

      file, temp = create(path)
      done = false
      begin
        yield file
        file.chmod(new_file_mode)
        file.close
        File.rename(temp, path)
        done = true
      ensure
        discard(file, temp) unless done
      end
      path
    end

    # The File::Stat of the device, FIFO or socket path names, to be written
    # in place (see above); nil for anything else. Raises for a block device,
    # and Refused for a special file someone else may have planted.
    def special(path)
      stat = File.stat(path) # through a symlink
      raise Errno::EINVAL, "#{path} is a block device" if stat.blockdev?
      return nil unless stat.chardev? || stat.pipe? || stat.socket?
      return nil if File.symlink?(path) && shared_directory?(File.dirname(path)) # replaced, not followed

      refuse_planted(path, stat)
      stat
    rescue Errno::ENOENT, Errno::ENOTDIR, Errno::ELOOP, Errno::EACCES
      nil
    end

    # Raises Refused if the special file stat (path's) belongs to neither
    # this process's user nor root and lies in a directory anyone can write
    # to. Where it lies: its real path's directory. A pipe or socket named
    # through /proc (/dev/stdout, /dev/fd/N) has none, nor can anyone plant it.
    def refuse_planted(path, stat)
      return if stat.uid == Process.euid || stat.uid.zero?

      dir = begin
        File.dirname(File.realpath(path))
      rescue SystemCallError
        return
      end
      return unless shared_directory?(dir)

      raise Refused.new(path, "a #{KINDS.fetch(stat.ftype, stat.ftype)} of uid #{stat.uid}'s in #{dir}, a directory " \
                              "anyone can write to: not written (another user may have put it there)")
    end

    KINDS = { "fifo" => "FIFO", "characterSpecial" => "character device" }.freeze

    def shared_directory?(dir)
      File.stat(dir).world_writable?
    rescue SystemCallError
      false
    end

    IN_PLACE = File::WRONLY | File::NONBLOCK | (defined?(File::NOCTTY) ? File::NOCTTY : 0)

    # Opens the special file stat describes without waiting for a reader,
    # checks that it is still that file, and yields it, blocking again.
    def write_in_place(path, stat)
      file = begin
        File.new(path, IN_PLACE, binmode: true)
      rescue Errno::ENXIO
        raise unless stat.pipe? || stat.socket?

        raise Unread.new(path, stat.pipe? ? "a FIFO that no process is reading" : "a socket, not a file to write")
      end
      begin
        opened = file.stat
        unless opened.dev == stat.dev && opened.ino == stat.ino
          raise Refused.new(path, "replaced by another file while it was being opened: not written")
        end

        file.fcntl(Fcntl::F_SETFL, file.fcntl(Fcntl::F_GETFL) & ~File::NONBLOCK)
        yield file
      ensure
        file.close
      end
      path
    end

    # [a new file opened for writing, its path], next to path.
    def create(path)
      ATTEMPTS.times do
        temp = temp_path(path)
        begin
          return [File.new(temp, FLAGS, 0o600, binmode: true), temp]
        rescue Errno::EEXIST, Errno::ELOOP
          next # someone else's file: left alone
        end
      end
      raise Errno::EEXIST, "#{path}: #{ATTEMPTS} random temporary names were all taken"
    end

    def temp_path(path)
      dir, name = File.split(path)
      File.join(dir, ".#{name[0, NAME_CHARS]}.strobe-#{SecureRandom.hex(16)}.tmp")
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
