# frozen_string_literal: true

require "test_helper"
require "json"
require "stringio"
require "tmpdir"
require "socket"
require "strobe/cli"

module CLITestHelpers
  ROOT = File.expand_path("..", __dir__)
  EXE = File.join(ROOT, "exe", "strobe")
  AUTORUN = File.join(ROOT, "lib", "strobe", "autorun.rb")

  def setup
    super
    @dir = Dir.mktmpdir("strobe-cli")
  end

  def teardown
    FileUtils.remove_entry(@dir) if @dir
    super
  end

  def path(name)
    File.join(@dir, name)
  end

  # Runs the CLI in-process: [exit status, stdout, stderr].
  def cli(*argv)
    out = StringIO.new
    err = StringIO.new
    status = Strobe::CLI.new(argv, out: out, err: err).run
    [status, out.string, err.string]
  end

  def assert_one_error_line(err, pattern)
    assert_equal 1, err.lines.size, "expected one line on stderr, got:\n#{err}"
    assert_match(/\Astrobe: /, err)
    assert_match pattern, err
  end

  def run_command(env, *command, chdir: @dir, timeout: 120)
    super
  end

  # A small result in the documented shape: 10 samples, 1 of them in GC.
  def fixture
    {
      version: 1.2, mode: :cpu, interval: 1000, samples: 10, gc_samples: 1, missed_samples: 0, metadata: {},
      frames: {
        1 => { name: "<main>", file: "main.rb", line: 1, total_samples: 9, samples: 0, edges: { 2 => 9 } },
        2 => { name: "Worker#spin", file: "main.rb", line: 2, total_samples: 9, samples: 6, edges: { 3 => 3 } },
        3 => { name: "Worker#tick", file: "main.rb", line: 7, total_samples: 3, samples: 3 },
        4 => { name: "(garbage collection)", file: "", total_samples: 1, samples: 1 },
      },
    }
  end

  def fixture_text(**options)
    io = StringIO.new
    Strobe::Report.new(fixture).print_text(io, **options)
    io.string
  end
end

class TestCLI < Minitest::Test
  include CLITestHelpers

  def test_version
    assert_equal [0, "strobe #{Strobe::VERSION}\n", ""], cli("--version")
  end

  def test_help
    status, out, err = cli("--help")
    assert_equal 0, status
    assert_equal "", err
    assert_match(/^Usage: strobe COMMAND/, out)
    assert_match(/^  run /, out)
    assert_match(/^  report /, out)
    assert_includes out, "gem install strobe-profiler"
    assert_equal cli("--help"), cli("-h")
  end

  def test_command_help
    status, out, = cli("run", "--help")
    assert_equal 0, status
    assert_match(/^Usage: strobe run/, out)
    assert_includes out, "--mode MODE"
    assert_includes out, "strobe-profile.json"
    assert_match(/--profile FILE +Where to write the profile/, out)
    assert_match(/-o, --out FILE +Write the report to FILE instead of standard error/, out)
    assert_match(/-q, --quiet +Write the profile only/, out)
    assert_match(/--limit N +Show only the first N frames \(default 30; 0: all\)/, out)
    assert_includes cli("report", "--help")[1], "--thread ID|NAME"
    assert_includes cli("report", "--help")[1], "http:// URL"
    assert_includes cli("serve", "--help")[1], "/TOKEN/strobe.json"

    status, out, = cli("help", "report")
    assert_equal 0, status
    assert_match(/^Usage: strobe report/, out)
    assert_equal out, cli("report", "-h")[1]
  end

  def test_no_arguments_prints_usage_and_fails
    status, out, err = cli
    assert_equal 1, status
    assert_equal "", out
    assert_match(/^Usage: strobe/, err)
  end

  def test_unknown_command
    status, out, err = cli("frobnicate")
    assert_equal 1, status
    assert_equal "", out
    assert_one_error_line err, /unknown command: frobnicate/
  end

  def test_unknown_options
    [%w[--bogus], %w[report --bogus x.json], %w[run --bogus ruby]].each do |argv|
      status, out, err = cli(*argv)
      assert_equal 1, status, argv.inspect
      assert_equal "", out
      assert_one_error_line err, /invalid option: --bogus/
    end
  end

  def test_report_of_a_saved_profile
    Strobe.save(fixture, path("p.json"))
    assert_equal [0, fixture_text, ""], cli("report", path("p.json"))
    assert_equal [0, fixture_text, ""], cli("report", "--text", path("p.json"))
  end

  def test_report_options_may_follow_the_file
    Strobe.save(fixture, path("p.json.gz"))
    assert_equal [0, fixture_text(limit: 2, sort_by_total: true), ""],
                 cli("report", path("p.json.gz"), "--limit", "2", "--sort-total")
  end

  def test_report_of_a_stackprof_json_file
    File.write(path("stackprof.json"), JSON.generate(fixture))
    status, out, err = cli("report", path("stackprof.json"))
    assert_equal 0, status, err
    assert_equal fixture_text, out
  end

  def test_report_of_a_missing_file
    status, out, err = cli("report", path("missing.json"))
    assert_equal 1, status
    assert_equal "", out
    assert_one_error_line err, /\Astrobe: cannot read profile #{Regexp.escape(path('missing.json'))}: .*No such file/
  end

  def test_report_of_corrupt_files
    Strobe.save(fixture, path("good.json"))
    good = File.binread(path("good.json"))
    Strobe.save(fixture, path("good.json.gz"))
    files = {
      "garbage.json" => "this is not a profile\n",
      "empty.json" => "",
      "truncated.json" => good[0, good.size / 2],
      "truncated.json.gz" => File.binread(path("good.json.gz"))[0, 30],
      "array.json" => "[1, 2, 3]",
      "marshal.dump" => Marshal.dump(fixture),
    }
    files.each do |name, bytes|
      File.binwrite(path(name), bytes)
      status, out, err = cli("report", path(name))
      assert_equal 1, status, name
      assert_equal "", out, name
      assert_one_error_line err, /\Astrobe: cannot read profile #{Regexp.escape(path(name))}: \S/
      assert_equal 1, err.scan(path(name)).size, "the path is named once: #{err}"
    end
  end

  def test_report_of_a_directory
    status, _, err = cli("report", @dir)
    assert_equal 1, status
    assert_one_error_line err, /cannot read profile/
  end

  def test_report_usage_errors
    [%w[report], %w[report a.json b.json], %w[report --limit 0 a.json], %w[report --limit x a.json]].each do |argv|
      status, out, err = cli(*argv)
      assert_equal 1, status, argv.inspect
      assert_equal "", out
      assert_one_error_line err, /./
    end
  end

  def test_run_usage_errors
    [
      [%w[run], /no COMMAND/],
      [%w[run --mode], /missing argument: --mode/],
      [%w[run --mode sideways ruby], /invalid mode: sideways/],
      [%w[run --interval 0 ruby], /interval/],
      [%w[run --interval soon ruby], /invalid argument: --interval soon/],
      [["run", "--profile", path("no/such/dir/p.json"), "ruby"], /profile path is not writable: .*does not exist/],
      [["run", "-o", path("no/such/dir/report.txt"), "ruby"], /cannot write the report to .*report\.txt: directory .* does not exist/],
      [["run", "-o", @dir, "ruby"], /cannot write the report to .*: it is a directory/],
      [["run", "-q", "-o", path("report.txt"), "ruby"], /--quiet writes no report, and -o FILE asks for one/],
      [["run", "-o", path("p.json"), "--profile", path("p.json"), "ruby"], /-o and --profile name the same file/],
      # -o named the profile before it named the report: such a command
      # line is refused rather than writing a text report into a .json file.
      [["run", "-o", path("profile.json"), "ruby"], /-o FILE is where the text report goes; write the profile with --profile/],
      [["run", "-o", path("profile.json.gz"), "ruby"], /--profile .*profile\.json\.gz/],
      [["run", "-o", path("r.JSON"), "ruby"], /-o FILE is where the text report goes; write the profile with --profile/],
      # What the program's autorun would refuse, having run the program
      # unprofiled.
      [%w[run --mode trace --raw ruby], /\Astrobe: run: --raw is about samples, and mode trace records none/],
      [%w[run --mode trace --interval 100 ruby], /mode :trace takes no :interval/],
      [%w[run --mode object --native ruby], /native: true needs mode :wall or :cpu/],
    ].each do |argv, pattern|
      status, out, err = cli(*argv)
      assert_equal 1, status, argv.inspect
      assert_equal "", out
      assert_one_error_line err, pattern
    end
  end

  def test_run_of_a_command_that_does_not_exist
    status, _, err = cli("run", "--profile", path("p.json"), "--", path("no-such-command"))
    assert_equal 1, status
    assert_one_error_line err, /cannot run .*no-such-command/
  end

  # Strobe's messages and the report go to stderr: stdout is the program's.
  def test_run_reports_and_returns_the_status_of_the_command
    status, out, err = cli("run", "--mode", "custom", "--profile", path("p.json"), "--", RbConfig.ruby, "-e", "exit 5")
    assert_equal 5, status
    assert_equal "", out
    assert_equal "strobe: profile written to #{path('p.json')}\n", err.lines.first
    assert_includes err, "Mode: custom"
    assert_includes err, "No samples were collected."
    assert_equal "custom", Strobe.load(path("p.json"))[:mode].to_s
  end

  # In a process of its own, as a user runs it: the program's output, and
  # only it, on stdout; -o puts the report in a file, --quiet leaves it out.
  def test_the_programs_output_is_its_own
    program = "$stdout.sync = true; puts :first; 3.times { Strobe.sample }; puts :last"
    out, err, status = run_command({}, RbConfig.ruby, EXE, "run", "--mode", "custom", "--", RbConfig.ruby, "-e", program)
    assert status.success?, err
    assert_equal "first\nlast\n", out
    assert_match(/\Astrobe: profile written to .*strobe-profile\.json\n=+\n  Mode: custom\n  Samples: 3 /, err)

    out, err, status = run_command({}, RbConfig.ruby, EXE, "run", "--mode", "custom", "-o", "report.txt", "--profile",
                                   "p.json", "--", RbConfig.ruby, "-e", program)
    assert status.success?, err
    assert_equal "first\nlast\n", out
    assert_equal ["strobe: profile written to #{File.join(File.realpath(@dir), 'p.json')}\n",
                  "strobe: report written to #{File.join(File.realpath(@dir), 'report.txt')}\n"], err.lines
    report = File.read(path("report.txt"))
    assert_match(/\A=+\n  Mode: custom\n  Samples: 3 /, report)
    assert_equal fixture_text.lines[5], report.lines[5], "the frame table's header"

    out, err, status = run_command({}, RbConfig.ruby, EXE, "run", "--mode", "custom", "-q", "--profile", "quiet.json",
                                   "--", RbConfig.ruby, "-e", program)
    assert status.success?, err
    assert_equal ["first\nlast\n", ""], [out, err]
    assert_equal 3, Strobe.load(path("quiet.json"))[:samples]
    _, err, status = run_command({}, RbConfig.ruby, EXE, "run", "-q", "--", RbConfig.ruby, "-e", "exit! 3")
    assert_equal 3, status.exitstatus
    assert_one_error_line err, /exited with status 3 without writing a profile/
  end

  # After a run, the text report shows its top 30 frames (--limit N
  # others, 0 all); `strobe report` shows all of them.
  def test_run_shows_the_top_30_frames
    program = "40.times { |i| eval(\"def m\#{i} = Strobe.sample\") }; 40.times { |i| send(:\"m\#{i}\") }"
    frame_rows = ->(text) { text.lines.count { |line| line.match?(/\A +\d+ +\([\d.]+%\) +\d+ +\([\d.]+%\)     \S/) } }
    status, _, err = cli("run", "--mode", "custom", "--profile", path("p.json"), "--", RbConfig.ruby, "-e", program)
    assert_equal 0, status, err
    assert_equal 30, frame_rows.(err)
    all = frame_rows.(cli("report", path("p.json"))[1])
    assert_operator all, :>=, 40
    assert_equal all, frame_rows.(cli("run", "--mode", "custom", "--limit", "0", "--profile", path("p.json"), "--",
                                      RbConfig.ruby, "-e", program)[2])
    assert_equal 5, frame_rows.(cli("run", "--mode", "custom", "-l", "5", "--profile", path("p.json"), "--",
                                    RbConfig.ruby, "-e", program)[2])
  end

  def test_run_passes_its_settings_to_the_command
    status, _, err = cli("run", "--mode", "custom", "--profile", path("raw.json"), "--",
                         RbConfig.ruby, "-e", "2.times { Strobe.sample }")
    assert_equal 0, status, err
    result = Strobe.load(path("raw.json"))
    assert_equal 2, result[:samples]
    assert result[:raw], "raw samples kept by default: the profile makes a flamegraph"
    assert_equal 0, cli("report", "--flamegraph", "-o", path("flame.html"), path("raw.json"))[0]

    status, _, err = cli("run", "-m", "custom", "-i", "2500", "--no-raw", "--profile", path("wall.json"), RbConfig.ruby,
                         "-e", "2.times { Strobe.sample }")
    assert_equal 0, status, err
    result = Strobe.load(path("wall.json"))
    assert_equal ["custom", 2], [result[:mode].to_s, result[:samples]]
    refute result[:raw], "--no-raw"

    status, _, err = cli("run", "-m", "wall", "-i", "2500", "--profile", path("wall.json"), RbConfig.ruby, "-e", "0")
    assert_equal 0, status, err
    assert_equal ["wall", 2500], Strobe.load(path("wall.json")).values_at(:mode, :interval).then { |m, i| [m.to_s, i] }
    status, _, err = cli("run", "-m", "trace", "--profile", path("trace.json"), RbConfig.ruby, "-e", "0")
    assert_equal 0, status, err
    assert_equal "trace", Strobe.load(path("trace.json"))[:mode].to_s, "no raw samples asked for in mode trace"
  end

  def test_run_of_a_command_that_writes_no_profile
    File.write(path("p.json"), "an old file, not replaced")
    status, out, err = cli("run", "--profile", path("p.json"), "--", RbConfig.ruby, "-e", "exit! 3")
    assert_equal 3, status
    assert_equal "", out
    assert_one_error_line err, /exited with status 3 without writing a profile to #{Regexp.escape(path('p.json'))}/

    status, _, err = cli("run", "--profile", path("p.json"), "--", RbConfig.ruby, "-e", "exit! 0")
    assert_equal 1, status
    assert_match(/without writing a profile/, err)
  end

  # Settings the program's autorun would refuse are refused before it
  # runs: it used to run unprofiled, and the run then failed for want of
  # a profile.
  def test_settings_the_program_would_refuse_are_refused_first
    [
      [{}, %w[--mode trace --raw], /\Astrobe: run: --raw is about samples, and mode trace records none/],
      [{ "STROBE_IGNORE_GC" => "1" }, %w[--mode trace], /\Astrobe: run: STROBE_IGNORE_GC is about samples/],
      [{ "STROBE_IGNORE_GC" => "perhaps" }, [], /\Astrobe: run: STROBE_IGNORE_GC must be 1 or 0/],
    ].each do |env, options, pattern|
      out, err, status = run_command(env, RbConfig.ruby, EXE, "run", *options, "--", RbConfig.ruby, "-e", "puts :ran")
      assert_equal [1, ""], [status.exitstatus, out], "#{options.inspect}: the program did not run"
      assert_one_error_line err, pattern
    end
    # STROBE_FORMAT is not for strobe run: its profile is Strobe's JSON.
    _, err, status = run_command({ "STROBE_FORMAT" => "speedscope" }, RbConfig.ruby, EXE, "run", "-m", "custom", "-q",
                                 "--", RbConfig.ruby, "-e", "Strobe.sample")
    assert status.success?, err
    assert_equal 1, Strobe.load(path("strobe-profile.json"))[:samples]
  end

  # Strobe's lib directory goes to the program on RUBYLIB (after which
  # what RUBYLIB held comes), the profile's directory in STROBE_OUT_DIR:
  # spaces in them, and in the working directory, are fine.
  def test_spaces_in_the_paths
    install = path("Strobe Install")
    FileUtils.mkdir_p(install)
    FileUtils.cp_r([File.join(ROOT, "lib"), File.join(ROOT, "exe")], install)
    project = path("My Project")
    extra = path("extra lib")
    FileUtils.mkdir_p([project, extra])
    File.write(File.join(extra, "extra_lib.rb"), "EXTRA = :loaded\n")
    program = "require 'extra_lib'; p EXTRA; 3.times { Strobe.sample }"
    out, err, status = run_command({ "RUBYLIB" => extra }, RbConfig.ruby, File.join(install, "exe", "strobe"), "run",
                                   "--mode", "custom", "--", RbConfig.ruby, "-e", program, chdir: project)
    assert status.success?, err
    assert_equal ":loaded\n", out
    profile = File.join(File.realpath(project), "strobe-profile.json")
    assert_equal "strobe: profile written to #{profile}\n", err.lines.first
    assert_match(/^  Samples: 3 /, err)
    assert_equal 3, Strobe.load(profile)[:samples]
  end

  # RUBYLIB separates directories with ':': Strobe's own cannot have one.
  def test_a_colon_in_strobes_directory
    install = path("strobe:1")
    FileUtils.mkdir_p(install)
    FileUtils.cp_r([File.join(ROOT, "lib"), File.join(ROOT, "exe")], install)
    %w[run serve].each do |command|
      out, err, status = run_command({}, RbConfig.ruby, File.join(install, "exe", "strobe"), command, "--",
                                     RbConfig.ruby, "-e", "puts :ran")
      assert_equal [1, ""], [status.exitstatus, out], command
      assert_one_error_line err, /\Astrobe: cannot #{command} with a ':' in Strobe's directory \(#{Regexp.escape(install)}\/lib\)/
    end
  end

  # A profile named .gz is gzipped, as Strobe.save writes such a name; any
  # other name is Strobe's JSON, as Strobe.save writes it.
  def test_a_profile_named_gz_is_gzipped
    %w[p.json.gz p.prof].each do |name|
      status, _, err = cli("run", "--mode", "custom", "--profile", path(name), "--", RbConfig.ruby, "-e",
                           "2.times { Strobe.sample }")
      assert_equal 0, status, err
      assert_match(/^  Samples: 2 /, err)
      assert_equal 2, Strobe.load(path(name))[:samples]
    end
    assert_equal "\x1f\x8b".b, File.binread(path("p.json.gz"), 2)
    assert_equal "{", File.read(path("p.prof"), 1)

    # several processes: their merge is gzipped too
    parent = "Strobe.sample; system(RbConfig.ruby, '-e', 'Strobe.sample') || exit(4)"
    status, _, err = cli("run", "--mode", "custom", "--profile", path("m.json.gz"), "--", RbConfig.ruby, "-e", parent)
    assert_equal 0, status, err
    assert_equal "\x1f\x8b".b, File.binread(path("m.json.gz"), 2)
    assert_equal 2, Strobe.load(path("m.json.gz"))[:samples]
  end

  # With several processes, the one to report on first is the one with
  # the most samples (the first to finish may have none).
  def test_several_processes_name_the_one_with_the_most_samples
    parent = "system(RbConfig.ruby, '-e', '0') || exit(4); 3.times { Strobe.sample }; puts $$"
    out, err, status = run_command({}, RbConfig.ruby, EXE, "run", "--mode", "custom", "--profile", path("p.json"), "--",
                                   RbConfig.ruby, "-e", parent)
    assert status.success?, err
    assert_equal 3, Strobe.load(path("p.#{out.to_i}.json"))[:samples]
    assert_equal "strobe: report on one with: strobe report #{path("p.#{out.to_i}.json")}\n",
                 err.lines.grep(/report on one/).first
  end

  # A Ruby program that runs others (rake test, a script): every Ruby
  # process keeps its profile; out is their merge.
  def test_run_keeps_the_profile_of_every_ruby_process
    # Each works for 0.2 s of its CPU (a loaded machine's timer thread can
    # miss a shorter burst in :cpu mode).
    busy = "t = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID); " \
           "20_000.times(&:to_s) while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - t < 0.2"
    child = "def in_child; #{busy}; end; in_child"
    parent = "def in_parent; #{busy}; end; in_parent; system(RbConfig.ruby, '-e', #{child.inspect}) || exit(4)"
    status, out, err = cli("run", "--mode", "cpu", "--profile", path("p.json"), "--", RbConfig.ruby, "-e", parent)
    assert_equal 0, status, err
    assert_equal "", out
    out = err # Strobe's own output
    assert_match(/\Astrobe: 2 Ruby processes profiled; their merged profile is in #{Regexp.escape(path('p.json'))}/, out)
    each = Dir[path("p.*.json")]
    assert_equal 2, each.size, out
    names = each.map { |file| Strobe.load(file)[:frames].values.map { |f| f[:name] } }
    assert_equal [["Object#in_child"], ["Object#in_parent"]], names.map { |n| n.grep(/in_/) }.sort
    each.each { |file| assert_includes out, File.basename(file) }
    merged = Strobe.load(path("p.json"))
    assert_equal each.sum { |file| Strobe.load(file)[:samples] }, merged[:samples]
    assert_equal 2, merged.dig(:metadata, :processes)
    assert_includes out, "Object#in_child"
    assert_includes out, "Object#in_parent"
    assert_empty Dir[path(".strobe-run-*")], "the run's directory is removed"
  end

  # The whole path, as a user runs it: exe/strobe in its own process.
  def test_run_profiles_the_example_program
    out, err, status = run_command({}, RbConfig.ruby, EXE, "run", "--mode", "cpu", "--",
                                   RbConfig.ruby, File.join(ROOT, "examples", "busy.rb"), "0.5")
    assert status.success?, "strobe run failed (#{status.inspect}):\n#{err}"
    profile = File.join(@dir, "strobe-profile.json")
    assert_equal "strobe: profile written to #{profile}\n", err.lines.first
    refute_includes out, "strobe:"
    assert_includes err, "  Mode: cpu(1000)\n"
    %w[Busy#run Busy#crunch_numbers Busy#build_strings Busy#sort_records].each do |name|
      assert_match(/^ +\d+ +\([\d.]+%\) +\d+ +\([\d.]+%\)     #{Regexp.escape(name)}$/, err)
    end
    result = Strobe.load(profile)
    assert_equal "cpu", result[:mode].to_s
    assert_operator result[:samples], :>, 0
  end

  # `ruby script.rb`: Ruby 3.1 names the script's top frame "script.rb" and
  # its methods' frames by the absolute path (4.0 names them all by the
  # absolute path). --files and --file count one file, named by its
  # absolute path: the profile keeps the directory it was taken in; a
  # profile without it takes the one absolute path ending so.
  def test_a_script_run_by_a_relative_path_is_one_file
    File.write(path("relative_script.rb"), <<~RUBY)
      def work
        i = 0
        while i < 20
          Strobe.sample
          i += 1
        end
      end
      work
      Strobe.sample
    RUBY
    _, err, status = run_command({}, RbConfig.ruby, EXE, "run", "--mode", "custom", "--raw", "-q", "--",
                                 RbConfig.ruby, "relative_script.rb")
    assert status.success?, err
    script = File.join(File.realpath(@dir), "relative_script.rb")
    result = Strobe.load(path("strobe-profile.json"))
    assert_equal File.realpath(@dir), result[:cwd]
    files = result[:frames].values.map { |f| f[:file] }.uniq
    assert_includes files, script
    assert_empty files.grep(/relative_script/) - [script, "relative_script.rb"]

    Strobe.save(result.except(:cwd), path("without_cwd.json"))
    %w[strobe-profile.json without_cwd.json].each do |name|
      status, out, err = cli("report", "--files", path(name))
      assert_equal [0, ""], [status, err], name
      rows = out.lines.drop(1)
      assert_equal 1, rows.grep(/relative_script\.rb/).size, "#{name}:\n#{out}"
      # (The samples' own frame is Strobe.sample's, a C method's.)
      assert_match(/\A +21 +\(100\.0%\) +0 +\(0\.0%\)     #{Regexp.escape(script)}\n\z/, rows.grep(/relative_script/).first)

      status, out, err = cli("report", "--file", "relative_script.rb", path(name))
      assert_equal [0, ""], [status, err], name
      assert_equal 1, out.lines.count { |line| line.include?("relative_script.rb") }, out
      assert_equal "#{script}\n", out.lines.first
      # the lines of the method's frame and of the top frame, in one listing
      assert_match(/^ +20 +\(95\.2%\) \/ +0 +\(0\.0%\)  \| +4  \|     Strobe\.sample$/, out)
      assert_match(/^ +20 +\(95\.2%\) \/ +0 +\(0\.0%\)  \| +8  \| work$/, out)
      assert_match(/^ +1 +\(4\.8%\) \/ +0 +\(0\.0%\)  \| +9  \| Strobe\.sample$/, out)
    end
  end

  # A server on 127.0.0.1 answering every request with response (the
  # request is read first); yields its URL.
  def answering(response)
    server = TCPServer.new("127.0.0.1", 0)
    thread = Thread.new do
      loop do
        client = server.accept
        request = +""
        request << client.readpartial(4096) until request.include?("\r\n\r\n")
        client.write(response)
        client.close
      end
    rescue IOError, SystemCallError
      nil # closed
    end
    yield "http://127.0.0.1:#{server.addr[1]}/p.json"
  ensure
    server&.close
    thread&.kill&.join
  end

  def http_response(body, head = "200 OK", headers = ["Content-Length: #{body.bytesize}"])
    "HTTP/1.1 #{head}\r\nConnection: close\r\n#{headers.map { |h| "#{h}\r\n" }.join}\r\n#{body}"
  end

  # A profile downloaded is read as a file, gzipped or not; what is not a
  # profile, an error status, an encoding other than gzip or a body larger
  # than a profile may be are one line each.
  def test_report_of_a_url
    profile = JSON.generate(Strobe::ProfileFile.encode(fixture))
    [http_response(profile), http_response(Zlib.gzip(profile), "200 OK", ["Content-Encoding: gzip"])].each do |response|
      answering(response) { |url| assert_equal [0, fixture_text, ""], cli("report", url) }
    end
    {
      http_response("not found\n", "404 Not Found") => /: HTTP 404 Not Found$/,
      http_response(profile, "200 OK", ["Content-Encoding: br"]) => /: the server sent it in br, not gzip$/,
      http_response("", "200 OK", ["Content-Length: #{Strobe::ProfileFile::MAX_INFLATED + 1}"]) => /: larger than 1024 MB/,
    }.each do |response, pattern|
      answering(response) do |url|
        status, out, err = cli("report", url)
        assert_equal [1, ""], [status, out], pattern.inspect
        assert_one_error_line err, /\Astrobe: cannot download #{Regexp.escape(url)}#{pattern.source}/
      end
    end
    answering(http_response("this is not a profile")) do |url|
      status, _, err = cli("report", url)
      assert_equal 1, status
      assert_one_error_line err, /\Astrobe: cannot read profile #{Regexp.escape(url)}: not valid JSON/
    end
  end

  # A URL that cannot be downloaded is one line: nothing listening, a
  # scheme other than http.
  def test_report_of_a_url_that_cannot_be_downloaded
    port = TCPServer.open("127.0.0.1", 0) { |server| server.addr[1] } # free once closed
    [
      ["http://127.0.0.1:#{port}/x/strobe.json", /cannot download .*: Connection refused$/],
      ["https://127.0.0.1:#{port}/x/strobe.json", /cannot download .*: only http:\/\/ URLs can be downloaded$/],
      ["http:///strobe.json", /cannot download .*: the URL names no host$/],
    ].each do |url, pattern|
      status, out, err = cli("report", url)
      assert_equal [1, ""], [status, out], url
      assert_one_error_line err, pattern
    end
  end
end

class TestAutorun < Minitest::Test
  include CLITestHelpers

  def autorun_env(**vars)
    { "RUBYOPT" => "-I#{File.join(ROOT, 'lib')} -r#{AUTORUN}", "STROBE_OUT" => path("p.json") }
      .merge(vars.transform_keys { |key| "STROBE_#{key.upcase}" })
  end

  def test_profile_includes_the_programs_own_at_exit_handlers
    _, err, status = run_command(autorun_env(mode: "custom"), RbConfig.ruby, "-e", "at_exit { Strobe.sample }")
    assert status.success?, err
    assert_equal 1, Strobe.load(path("p.json"))[:samples]
  end

  def test_bad_settings_warn_and_leave_the_program_alone
    { interval: "soon", mode: "sideways", raw: "perhaps" }.each do |name, value|
      out, err, status = run_command(autorun_env(name => value), RbConfig.ruby, "-e", "puts :ran; exit 4")
      assert_equal 4, status.exitstatus, err
      assert_equal "ran\n", out
      assert_one_error_line err, /STROBE_#{name.upcase}|#{value}/
      refute File.exist?(path("p.json"))
    end
  end

  # An export named by STROBE_FORMAT keeps raw samples without STROBE_RAW;
  # STROBE_RAW=0 with it is refused, in one line, the program left alone.
  def test_export_formats_turn_raw_on
    code = "t = Thread.new { sleep 0.05 }; t.name = 'napper'; t.join"
    _, err, status = run_command(autorun_env(format: "speedscope", out: path("p.speedscope.json")), RbConfig.ruby, "-e", code)
    assert status.success?, err
    doc = JSON.parse(File.read(path("p.speedscope.json")))
    assert_includes doc["profiles"].map { |p| p["name"] }, "napper"
    out, err, status = run_command(autorun_env(format: "pprof", raw: "0"), RbConfig.ruby, "-e", "puts :ran")
    assert_equal ["ran\n", true], [out, status.success?]
    assert_one_error_line err, /format :pprof needs raw: true/
  end

  def test_only_the_process_that_started_writes_the_profile
    code = <<~RUBY
      pid = fork { Strobe.sample }
      Process.wait(pid)
      puts File.exist?(ENV["STROBE_OUT"])
    RUBY
    out, err, status = run_command(autorun_env(mode: "custom"), RbConfig.ruby, "-e", code)
    assert status.success?, err
    assert_equal "false\n", out
    assert File.exist?(path("p.json"))
  end
end

# strobe report's formats, merging, -o and --marshal.
class TestCLIReport < Minitest::Test
  include CLITestHelpers

  def raw_profile(mode: :cpu, interval: 1000)
    result = fixture.merge(mode: mode, interval: interval, raw: [2, 1, 2, 6, 3, 1, 2, 3, 3, 1, 4, 1],
                           raw_lines: [2, 1, 2, 6, 3, 1, 2, 7, 3, 1, 0, 1])
    result[:frames] = result[:frames].transform_values { |f| f.except(:edges) }
    result
  end

  def test_every_format
    Strobe.save(raw_profile, path("p.json"))
    {
      %w[--files] => /main\.rb$/,
      %w[--method Worker#spin] => /\AWorker#spin \(main\.rb:2\)\n  samples: +6 self/,
      %w[--method /tick/] => /\AWorker#tick/,
      %w[--graphviz] => /\Adigraph profile/,
      %w[--graphviz --node-fraction 0.5] => /Worker#spin/,
      %w[--callgrind] => /^events: Samples$/,
      %w[--stackcollapse] => /^<main>;Worker#spin 6$/,
      %w[--json] => /\A\{"version":1\.2/,
      %w[--file main.rb] => /\Amain\.rb\n/,
      %w[--text --select-names spin] => /Worker#spin\n\z/,
      %w[--text --reject-names spin --reject-files /nowhere] => /Worker#tick/,
    }.each do |options, pattern|
      status, out, err = cli("report", path("p.json"), *options)
      assert_equal [0, ""], [status, err], options.inspect
      assert_match pattern, out, options.inspect
    end
  end

  def test_output_to_a_file
    Strobe.save(raw_profile, path("p.json"))
    assert_equal [0, "", ""], cli("report", path("p.json"), "--stackcollapse", "-o", path("out.txt"))
    assert_includes File.read(path("out.txt")), "<main>;Worker#spin 6\n"
    status, _, err = cli("report", path("p.json"), "-o", path("no/such/dir/out.txt"))
    assert_equal 1, status
    assert_one_error_line err, /cannot write .*out\.txt/
  end

  # Someone who can write the directory planted a symlink where `report -o`
  # put its temporary file: the report is written, not what the link points to.
  def test_output_to_a_file_does_not_follow_planted_symlinks
    Strobe.save(raw_profile, path("p.json"))
    File.write(path("victim"), "root's secret")
    File.chmod(0o600, path("victim"))
    out = path("report.txt")
    planted = "#{out}.#{Process.pid}.tmp"
    File.symlink(path("victim"), planted)
    assert_equal [0, "", ""], cli("report", path("p.json"), "--stackcollapse", "-o", out)
    assert_equal "root's secret", File.read(path("victim"))
    assert_equal 0o600, File.stat(path("victim")).mode & 0o777
    assert_includes File.read(out), "<main>;Worker#spin 6\n"
    assert File.symlink?(planted), "someone else's symlink is left alone"
    assert_equal ["p.json", "report.txt", "report.txt.#{Process.pid}.tmp", "victim"], Dir.children(@dir).sort
  end

  # A report that fails midway leaves FILE as it was, and no temporary file.
  def test_a_failed_report_leaves_the_output_file_alone
    Strobe.save(fixture, path("p.json"))
    File.write(path("out.txt"), "old")
    status, out, err = cli("report", path("p.json"), "--method", "Nope#nope", "-o", path("out.txt"))
    assert_equal [1, ""], [status, out]
    assert_one_error_line err, /no method named "Nope#nope"/
    status, _, err = cli("report", path("p.json"), "-o", path("p.json/out.txt"))
    assert_equal 1, status
    assert_one_error_line err, %r{cannot write .*p\.json/out\.txt: Not a directory}
    assert_equal "old", File.read(path("out.txt"))
    assert_equal %w[out.txt p.json], Dir.children(@dir).sort
  end

  # Names from a profile with ESC sequences, newlines and C1 controls never
  # reach the terminal as such: not in a report, not in an error line.
  def test_control_characters_in_names_are_escaped
    result = raw_profile
    result[:frames][2] = result[:frames][2].merge(name: "Worker#spin\e[2J\nx", file: "main\e[31m.rb")
    result[:frames][3] = result[:frames][3].merge(name: "Worker#\u009b1mtick\x7f")
    result[:threads] = { 5 => { name: "pool\e]0;owned\a", samples: 10, states: { running: 10 } } }
    result[:raw_sample_threads] = [5] * 10
    Strobe.save(result, path("p.json"))
    control = /[\x00-\x09\x0b-\x1f\x7f\u0080-\u009f]/
    [[], %w[--sort-total], %w[--thread 5], %w[--files], %w[--method /spin/], %w[--method Worker#spin --walk],
     %w[--debug], %w[--callgrind], %w[--graphviz], %w[--stackcollapse]].each do |options|
      status, out, err = cli("report", path("p.json"), *options)
      assert_equal [0, ""], [status, err], options.inspect
      refute_match control, out.dup.force_encoding(Encoding::UTF_8), options.inspect
    end
    _, out, = cli("report", path("p.json"))
    assert_includes out, "Worker#spin\\e[2J\\nx\n"
    assert_includes out, "Worker#\\u009B1mtick\\x7F\n"
    assert_match(/^ +5 +10 \(100\.0%\) .* pool\\e\]0;owned\\x07$/, out)
    [
      [["--file", "none\e[2J"], /no samples in a file matching none\\e\[2J$/],
      [["--method", "none\e[2J"], /no method named "none\\e\[2J"/],
      [["--thread", "9"], /no thread 9 in this profile \(threads: pool\\e\]0;owned\\x07 \(5\)\)/],
      [["--thread", "pool\e]0"], /no thread "pool\\e\]0" in this profile/],
      [["--endpoint", "none\e[2J"], /no request to endpoint "none\\e\[2J" in this profile \(endpoints: none: it was not profiled/],
      [["-o", path("no\e[2Jdir/out.txt")], /cannot write .*no\\e\[2Jdir/],
    ].each do |options, pattern|
      status, out, err = cli("report", path("p.json"), *options)
      assert_equal [1, ""], [status, out], options.inspect
      assert_one_error_line err, pattern
      refute_match control, err, options.inspect
    end
    missing = path("missing\e[2J\u009b\xff.json".b)
    status, _, err = cli("report", missing)
    assert_equal 1, status
    assert_one_error_line err, /cannot read profile .*missing\\e\[2J\\u009B\\xFF\.json: No such file/
    assert err.valid_encoding?
  end

  def test_several_files_are_merged
    Strobe.save(raw_profile, path("a.json"))
    Strobe.save(raw_profile, path("b.json.gz"))
    status, out, err = cli("report", path("a.json"), path("b.json.gz"), "--stackcollapse")
    assert_equal [0, ""], [status, err]
    assert_equal ["<main>;Worker#spin 12\n", "<main>;Worker#spin;Worker#tick 6\n", "(garbage collection) 2\n"].sort,
                 out.lines.sort
    status, out, = cli("report", path("a.json"), path("b.json.gz"))
    assert_equal 0, status
    assert_match(/Samples: 20 /, out)
  end

  # Two frames of one profile with the same name, file and line (here two
  # <main> frames without a line, nested) stay two in a merge: no total
  # comes to more than every sample.
  def test_a_merge_keeps_frames_that_share_a_name_apart
    frames = { 1 => { name: "<main>", file: "-e", total_samples: 4, samples: 0, edges: { 2 => 4 } },
               2 => { name: "<main>", file: "-e", total_samples: 4, samples: 1, edges: { 3 => 3 } },
               3 => { name: "Object#work", file: "-e", line: 1, total_samples: 3, samples: 3 } }
    raw = [2, 1, 2, 1, 3, 1, 2, 3, 3]
    result = { version: 1.2, mode: :custom, interval: nil, samples: 4, gc_samples: 0, missed_samples: 0, frames: frames,
               raw: raw, raw_lines: raw.map { 0 } }
    merged = Strobe::Merge.results([result, result])
    assert_equal [8, 8, 6], merged[:frames].values.map { |f| f[:total_samples] }
    Strobe.save(result, path("e.json"))
    status, out, err = cli("report", path("e.json"), path("e.json"))
    assert_equal [0, ""], [status, err]
    mains = out.lines.grep(/<main>$/)
    assert_equal 2, mains.size
    mains.each { |row| assert_match(/\A\s+8 \(100\.0%\)/, row) }
  end

  def test_files_of_different_modes_are_not_merged
    Strobe.save(raw_profile, path("a.json"))
    Strobe.save(raw_profile(mode: :wall), path("b.json"))
    status, out, err = cli("report", path("a.json"), path("b.json"))
    assert_equal [1, ""], [status, out]
    assert_one_error_line err, /cannot merge .*b\.json \(mode wall\) with .*a\.json \(mode cpu\)/
    Strobe.save(raw_profile(interval: 10), path("c.json"))
    _, _, err = cli("report", path("a.json"), path("c.json"))
    assert_one_error_line err, /interval 10/
  end

  # `stackprof FILE --FLAG` scripts work as `strobe report FILE --FLAG`.
  def test_stackprofs_report_flags
    Strobe.save(raw_profile, path("p.json"))
    {
      %w[--timeline-flamegraph] => /"view":"timeline"/,
      %w[--alphabetical-flamegraph] => /"view":"aggregated"/,
      %w[--d3-flamegraph] => /"view":"aggregated"/,
      %w[--debug] => /\A#{Regexp.escape({ version: 1.2 }.inspect.chomp("}"))},/,
      %w[--method spi] => /\AWorker#spin \(main\.rb:2\)/,
      %w[--file ain.r] => /\Amain\.rb\n/,
      %w[--limit 0] => /Worker#spin\n.*Worker#tick\n/m,
      %W[--flamegraph-viewer #{path('f.html')}] => /\Aopen file:\/\/#{Regexp.escape(path('f.html'))}\n\z/,
    }.each do |options, pattern|
      status, out, err = cli("report", path("p.json"), *options)
      assert_equal [0, ""], [status, err], options.inspect
      assert_match pattern, out, options.inspect
    end
    status, out, = cli("report", path("p.json"), "--graphviz", "--limit", "1")
    assert_equal [0, 1], [status, out.scan(/\[label="/).size], "--graphviz --limit 1 draws the busiest frame"
    status, out, err = cli("report", path("p.json"), "--dump")
    assert_equal [0, ""], [status, err]
    dumped = Marshal.load(out) # rubocop:disable Security/MarshalLoad -- our own output
    assert_equal Strobe.load(path("p.json"))[:frames], dumped[:frames]
  end

  # stackprof's own dumps are Marshal data: loaded only when asked, with a warning.
  def test_marshal_dumps_only_with_marshal
    File.binwrite(path("stackprof.dump"), Marshal.dump(raw_profile))
    status, _, err = cli("report", path("stackprof.dump"))
    assert_equal 1, status
    assert_one_error_line err, /Marshal.*--marshal/
    status, out, err = cli("report", "--marshal", path("stackprof.dump"))
    assert_equal 0, status, err
    assert_one_error_line err, /warning: loading .*stackprof\.dump with Marshal, which can run code/
    assert_match(/Worker#spin/, out)
    File.binwrite(path("bad.dump"), Marshal.dump([1, 2]))
    status, _, err = cli("report", "--marshal", path("bad.dump"))
    assert_equal 1, status
    assert_match(/not a profile/, err)
  end

  def test_format_errors_are_one_line
    Strobe.save(fixture, path("p.json"))
    [
      [%w[--text --files], /one format at a time \(got --text and --files\)/],
      [%w[--stackcollapse], /needs per-sample data/],
      [%w[--method Nope#nope], /no method named "Nope#nope"/],
      [%w[--method /(/], /--method \/\(\/: /],
      [%w[--select-names (], /invalid argument/],
      [%w[--node-fraction 2 --graphviz], /must be from 0 to 1/],
      [%w[--file nowhere.rb], /no samples in a file matching nowhere\.rb/],
    ].each do |options, pattern|
      status, out, err = cli("report", path("p.json"), *options)
      assert_equal [1, ""], [status, out], options.inspect
      assert_one_error_line err, pattern
    end
  end

  def test_corrupt_raw_in_merged_files_is_one_line
    bad = raw_profile.merge(raw: [-2, 1, 1])
    Strobe.save(raw_profile, path("a.json"))
    File.write(path("b.json"), JSON.generate(Strobe::ProfileFile.encode(raw_profile)).sub(/"stacks":\{.*?\}\}?/m, "\"x\":1"))
    File.write(path("c.json"), JSON.generate(bad))
    status, out, err = cli("report", path("a.json"), path("c.json"), "--stackcollapse")
    assert_equal [1, ""], [status, out]
    assert_one_error_line err, /raw is truncated|raw/
  end

  # A profile whose --json (and text report) is some 500 KB: more than a
  # pipe or an IO's buffer holds.
  def big_profile
    frames = (1..4000).to_h do |i|
      [i, { name: "Object#method_#{i}", file: "app/models/file_#{i}.rb", line: i, total_samples: 1, samples: 1 }]
    end
    fixture.merge(samples: 4000, gc_samples: 0, frames: frames)
  end

  # `strobe report FILE | head -1`: the reader going away is not an error.
  def test_a_closed_pipe_ends_the_report_quietly
    Strobe.save(big_profile, path("p.json"))
    reader, writer = IO.pipe
    head = Thread.new do
      reader.read(100)
      reader.close
    end
    err = StringIO.new
    status = Strobe::CLI.new(["report", path("p.json"), "--json"], out: writer, err: err).run
    assert_equal [0, ""], [status, err.string]
    assert head.join(60), "the reader read"
  ensure
    writer&.close
  end

  # exe/strobe with its standard output to out (a path, :close, an IO),
  # killed after 120 s (a safeguard against a hang): [stderr, status].
  def strobe_writing_to(out, *args)
    err = path("stderr-#{rand(1 << 30)}")
    pid = Process.spawn(RbConfig.ruby, EXE, *args, in: File::NULL, out: out, err: err, pgroup: true)
    waiter = Process.detach(pid)
    unless waiter.join(120)
      Process.kill(:KILL, -pid)
      waiter.join
      flunk "strobe #{args.join(' ')} did not finish within 120 s"
    end
    [File.read(err), waiter.value]
  end

  # Output that cannot be written is one line and status 1: a full disk
  # (what Ruby held in its buffer failed unseen at exit, with status 0; a
  # larger output failed with Errno::ENOSPC's class and a hint at
  # STROBE_DEBUG), or a standard output closed at start (`>&-`). A reader
  # that goes away after it started reading (`| head`) is still no error.
  def test_output_that_cannot_be_written
    Strobe.save(fixture, path("small.json"))
    Strobe.save(big_profile, path("big.json"))
    [["small.json"], ["big.json", "--json"]].each do |args|
      err, status = strobe_writing_to("/dev/full", "report", *args.map { |a| a.end_with?(".json") ? path(a) : a })
      assert_equal 1, status.exitstatus, args.inspect
      assert_equal "strobe: cannot write the report: No space left on device\n", err, args.inspect
    end
    err, status = strobe_writing_to(:close, "report", path("small.json"))
    assert_equal [1, "strobe: cannot write the report: nothing reads standard output (it is closed)\n"],
                 [status.exitstatus, err]
    err, status = strobe_writing_to("/dev/full", "--help")
    assert_equal [1, "strobe: cannot write the output: No space left on device\n"], [status.exitstatus, err]

    reader, writer = IO.pipe
    head = Thread.new do
      first = reader.read(100)
      reader.close
      first
    end
    err, status = strobe_writing_to(writer, "report", path("big.json"), "--json")
    assert_equal [0, ""], [status.exitstatus, err]
    assert_equal '{"version":1.2', head.value[0, 14]
  ensure
    writer&.close
  end

  # The exports, flamegraph and folded stacks of a trace: it records no
  # samples, which profiling with raw samples would not change.
  def test_what_needs_samples_of_a_trace
    trace = Strobe.run(mode: :trace) { 3.times { [1].map(&:to_s) } }
    Strobe.save(trace, path("t.json"))
    [%w[--flamegraph], %w[--firefox], %w[--speedscope], %w[--stackcollapse], %w[--pprof -o x.pb.gz],
     %w[--sampling-prof], %w[--thread main]].each do |options|
      status, out, err = cli("report", path("t.json"), *options)
      assert_equal [1, ""], [status, out], options.inspect
      assert_one_error_line err, /needs samples, and mode trace records none: it counts calls and times \(the text, /
      refute_match(/--raw|raw: true/, err)
    end
    status, out, = cli("report", path("t.json"), "--callgrind")
    assert_equal 0, status
    assert_match(/^events: /, out)
  end

  # What `strobe report --json` writes (stackprof's layout, thread ids as
  # JSON's string keys) makes every format, as Strobe's own files do.
  def test_a_profile_written_by_report_json_makes_every_format
    result = Strobe.run(mode: :custom, raw: true) do
      Thread.new { 2.times { Strobe.sample } }.join
      3.times { Strobe.sample }
    end
    Strobe.save(result, path("p.json"))
    assert_equal [0, "", ""], cli("report", path("p.json"), "--json", "-o", path("s.json"))
    %w[--flamegraph --firefox --speedscope --pprof --stackcollapse --sampling-prof].each do |format|
      status, _, err = cli("report", path("s.json"), format, "-o", path("out"))
      assert_equal [0, ""], [status, err], format
    end
    assert_equal cli("report", path("p.json"), "--stackcollapse"), cli("report", path("s.json"), "--stackcollapse")
    assert_equal cli("report", path("p.json"), "--thread", "main"), cli("report", path("s.json"), "--thread", "main")
  end

  def test_walk_goes_from_a_method_to_its_callees_and_callers
    Strobe.save(fixture, path("p.json"))
    out = StringIO.new
    err = StringIO.new
    input = StringIO.new("2\n9\nx\n1\n\n")
    status = Strobe::CLI.new(["report", path("p.json"), "--method", "Worker#spin", "--walk"],
                             out: out, err: err, input: input).run
    assert_equal [0, ""], [status, err.string]
    text = out.string
    assert_match(/\AWorker#spin \(main\.rb:2\)/, text)
    assert_match(/Select next method:\n +1\)  <main>\n +2\)  Worker#tick\n +3\)  exit\n/, text)
    assert_match(/^Worker#tick \(main\.rb:7\)/, text, "2 went to the callee")
    assert_match(/Not a choice: 9 \(1 to 2; a blank line or 2 exits\)/, text)
    assert_match(/Not a choice: x/, text)
    assert_match(/^Worker#spin \(main\.rb:2\)[^\n]*\n.*\z/m, text.split("Worker#tick (main.rb:7)").last, "1 went back to the caller")
    status, _, err = cli("report", path("p.json"), "--walk")
    assert_equal 1, status
    assert_one_error_line err, /--walk goes with --method/
  end
end

