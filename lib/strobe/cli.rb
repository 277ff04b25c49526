# frozen_string_literal: true

# The `strobe` command's entry: Strobe::CLI, its dispatch to the commands
# (cli/run_command.rb, cli/report_command.rb, cli/serve_command.rb), its
# errors, loading profiles, the options the commands share, and help.

require "fileutils"
require "optparse"
require "pp"
require "securerandom"
require "zlib"
require_relative "version"
require_relative "redact"
require_relative "options"
require_relative "report"
require_relative "merge"
require_relative "atomic_file"
require_relative "cli/download"
require_relative "cli/run_command"
require_relative "cli/report_command"
require_relative "cli/serve_command"

module Strobe
  # The `strobe` command line:
  #
  #   strobe run [options] [--] COMMAND...   profile COMMAND, then report
  #   strobe report [options] FILE|URL...    report on saved profiles
  #   strobe serve [options] [--] COMMAND... run COMMAND, serving its profile
  #                                          to the Firefox Profiler
  #
  # Strobe::CLI.new(argv).run returns the exit status instead of exiting, and
  # reports every problem as one `strobe: ...` line on err, never a backtrace.
  # `strobe run` writes everything of its own on err: out is the profiled
  # program's.
  class CLI
    include RunCommand
    include ReportCommand
    include ServeCommand

    DEFAULT_PROFILE = "strobe-profile.json"
    LIB_DIR = File.expand_path("..", __dir__)
    MODES = Options::MODES.map(&:to_s).freeze

    # A command line that cannot be carried out; its message is shown as is.
    class UsageError < StandardError; end

    # own_process: the process is the command's own (exe/strobe), not a
    # program that runs the CLI in it: its settings are the command's to
    # change (Native.allow_huge_pages).
    def initialize(argv, out: $stdout, err: $stderr, input: $stdin, own_process: false)
      @argv = argv.dup
      @out = out
      @err = err
      @in = input
      @own_process = own_process
    end

    # Runs the command line and returns the exit status.
    def run
      flushed(catch(:exit) { dispatch(@argv.dup) })
    rescue OptionParser::ParseError => e
      error "#{e.message} (see strobe #{"#{@command} " if @command}--help)"
    rescue UsageError => e
      error e.message
    rescue Errno::EPIPE
      0 # the reader of our output went away (e.g. `| head`)
    rescue Interrupt
      130
    rescue NoMemoryError
      error "out of memory#{" (#{@command})" if @command}: the profile needs more than this machine gives"
    rescue StandardError => e
      raise if ENV["STROBE_DEBUG"]

      error "#{e.class}: #{e.message.lines.first&.chomp} (STROBE_DEBUG=1 shows the backtrace)"
    end

    private

    # status, once what is still buffered of the output is written: a full
    # disk or a closed standard output is an error line, not an exit 0 with
    # nothing written. (After a failure, said already, what it left is not.)
    def flushed(status)
      @out.flush if status.zero? && @out.respond_to?(:flush)
      status
    rescue Errno::EPIPE
      raise
    rescue SystemCallError, IOError => e
      error "cannot write the output: #{system_reason(e)}"
    end

    def dispatch(args)
      command = args.shift
      case command
      when "run", "report", "serve"
        @command = command
        public_send(:"#{command}_command", args)
      when "help" then help(args.first)
      when "-h", "--help" then help(nil)
      when "-v", "--version" then version
      when nil
        @err.puts general_help
        1
      when /\A-/ then raise OptionParser::InvalidOption, command
      else raise UsageError, "unknown command: #{command} (commands: run, report, serve; see strobe --help)"
      end
    end

    # --- profiles ------------------------------------------------------------

    # The profile in the file path, or downloaded from the URL path, checked;
    # nil once a failure is said in one line.
    def load_profile(path, marshal: false)
      return nil unless require_engine

      Native.allow_huge_pages if @own_process # for its large buffers (Native.allow_huge_pages says why)

      name = shown_path(path)
      begin
        return Download.new(path).open { |file| read_profile(file, name, marshal) } if Download.url?(path)

        read_profile(path, name, marshal)
      rescue DownloadError => e
        error "cannot download #{name}: #{e.message}"
        nil
      rescue Strobe::ProfileError, SystemCallError, ArgumentError => e
        error "cannot read profile #{name}: #{load_failure_reason(e, name)}"
        nil
      end
    end

    # A profile's path or URL as messages show it: a URL without its user,
    # password and query (Redact.url).
    def shown_path(path)
      Download.url?(path) ? Redact.url(path) : path
    end

    # The profile in file, called name in messages (a downloaded one, its
    # URL): what Strobe.load does, the file read once (it may be a pipe).
    def read_profile(file, name, marshal)
      bytes = ProfileFile.read_bytes(file, name)
      if marshal && ProfileFile.magic?(bytes, ProfileFile::MARSHAL_MAGIC)
        @err.puts "strobe: warning: loading #{name} with Marshal, which can run code from the file"
      end
      result = ProfileFile.parse(bytes, name, marshal: marshal, owned: true)
      Report.new(result) # checks the shape
      result
    end

    # Why a profile could not be read, without repeating its path.
    def load_failure_reason(error, path)
      return system_reason(error) if error.is_a?(SystemCallError)

      error.message.delete_prefix("#{path}: ")
    end

    def require_engine
      require_relative "../strobe"
      true
    rescue LoadError => e
      error "cannot load Strobe (is the extension built? try `rake compile`): #{e.message}"
      false
    end

    # --- shared --------------------------------------------------------------

    # --mode and --interval, for the commands that profile.
    def sampling_options(parser, settings)
      parser.on("-m", "--mode MODE", "Sampling mode: #{MODES.join(', ')} (default: wall)") do |mode|
        settings[:mode] = mode
      end
      parser.on("-i", "--interval N", Integer,
                "Sampling interval: microseconds, or allocations in object mode (default: 1000 / 1)") do |n|
        settings[:interval] = n
      end
      parser.on("--native", "Also record native (C) frames, under the Ruby frames that called them (wall, cpu)") do
        settings[:native] = true
      end
    end

    def report_options(parser, settings, default_limit: nil)
      default = default_limit ? "default #{default_limit}; 0: all" : "0: all, as stackprof"
      parser.on("-l", "--limit N", Integer, "Show only the first N frames (#{default})") do |n|
        raise OptionParser::InvalidArgument, "#{n} (must be at least 0)" if n.negative?

        settings[:limit] = n.zero? ? nil : n
      end
      parser.on("--sort-total", "Sort frames by total samples instead of self samples") do
        settings[:sort_by_total] = true
      end
    end

    def common_options(parser)
      parser.on("-h", "--help", "Show this help") do
        @out.puts parser
        throw :exit, 0
      end
      parser.on("-v", "--version", "Show Strobe's version") { throw :exit, version }
    end

    # The environment loading Strobe's autorun into every Ruby process:
    # Strobe's lib directory first on RUBYLIB (':'-separated, so a space in
    # it is fine, where RUBYOPT splits at spaces), and RUBYOPT requiring
    # strobe/autorun from there.
    def ruby_env
      if LIB_DIR.include?(File::PATH_SEPARATOR)
        raise UsageError, "cannot #{@command} with a '#{File::PATH_SEPARATOR}' in Strobe's directory (#{LIB_DIR}): " \
                          "RUBYLIB, which carries it to the command, separates directories with it"
      end

      { "RUBYLIB" => [LIB_DIR, ENV["RUBYLIB"]].compact.reject(&:empty?).join(File::PATH_SEPARATOR),
        "RUBYOPT" => [ENV["RUBYOPT"], "-rstrobe/autorun"].compact.reject(&:empty?).join(" ") }
    end

    def help(command)
      case command
      when nil then @out.puts general_help
      when "run" then @out.puts run_parser({})
      when "report" then @out.puts report_parser({})
      when "serve" then @out.puts serve_parser({})
      else raise UsageError, "unknown command: #{command} (commands: run, report, serve)"
      end
      0
    end

    def general_help
      <<~HELP
        Usage: strobe COMMAND [options]

        Strobe is a sampling call-stack profiler for Ruby (the gem strobe-profiler:
        gem install strobe-profiler).

        Commands:
          run [options] [--] COMMAND...   Profile COMMAND (e.g. `ruby app.rb`), write the profile
                                          (default: #{DEFAULT_PROFILE}) and print its report on
                                          standard error (COMMAND's output stays its own)
          report [options] FILE|URL...    Report on saved (or served) profiles: text, files, method,
                                          graphviz, callgrind, stackcollapse, json, flamegraph, or
                                          exports for pprof, the Firefox Profiler and speedscope
          serve [options] [--] COMMAND... Profile COMMAND and serve the profile so far to the
                                          Firefox Profiler and to strobe report (links printed)
          help [COMMAND]                  Show help for a command

        Options:
          -h, --help                      Show this help
          -v, --version                   Show Strobe's version

        Example:
          strobe run --mode cpu -- ruby examples/busy.rb
      HELP
    end

    def version
      @out.puts "strobe #{VERSION}"
      0
    end

    # The reason without the path and the call Ruby adds ("... @ rb_sysopen - FILE").
    def system_reason(error)
      return error.reason if error.is_a?(AtomicFile::TargetError)

      error.class < SystemCallError ? error.class.new.message : error.message
    end

    # Prints one line on err and returns the exit status 1. Messages quote
    # names from profiles and paths: control characters are escaped (see
    # Report.printable), bytes that are not UTF-8 too.
    def error(message)
      line = Report.printable(message.to_s.b.gsub(/\s+/n, " ").strip)
      line = "#{line[0, 297]}..." if line.length > 300
      @err.puts "strobe: #{line}"
      1
    end
  end
end
