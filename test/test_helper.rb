# frozen_string_literal: true

require "minitest/autorun"
require "strobe"
require "rbconfig"
require "open3"
require "timeout"
require "tmpdir"
require "zlib"

# Every test runs with compaction after each major GC: profiler tables must
# survive objects moving under them.
#
# GC.start first: Ruby 3.1.2 has a bug where turning auto-compaction on
# while an incremental major GC is still marking makes that GC's lazy sweep
# compact although marking pinned nothing (gc_marks_start decides pinning
# from the flag at the start of marking, gc_sweep decides compaction from
# the flag at sweep time). Objects the VM needs pinned then move under it:
# a call cache in the global call-cache table, read as freed memory at the
# next GC (a segfault), or a Thread::Queue's array (minitest's queue came up
# "not initialized"). Whether a GC is marking at that point depends only on
# how much was allocated while loading, which is why it came and went with
# build variants. Ruby 3.3 decides both at the start of the GC.
GC.start
GC.auto_compact = true unless ENV["STROBE_TEST_NO_AUTO_COMPACT"]

module StrobeTestHelpers
  ROOT = File.expand_path("..", __dir__)
  LIB = File.join(ROOT, "lib")
  # This Ruby's build tree (the Rakefile's BUILD): one per Ruby ABI.
  BUILD = File.join(ROOT, "tmp", RbConfig::CONFIG["ruby_version"])

  # GC at every allocation while the block runs, compacting as the suite
  # does, except on Ruby before 3.3: there a compacting GC also reads the
  # VM stack slot just past the top (rb_vm_each_stack_value's `p <= sp`,
  # fixed by ruby/ruby#7081), a stale VALUE left by an earlier call, and
  # segfaults once that object's page is freed. GC.stress with auto_compact
  # meets it sooner or later with or without Strobe (seen on 3.1 in the
  # full suite, at `2**64`, whose frame's top slot held a freed object).
  def under_gc_stress
    compact = GC.auto_compact
    GC.auto_compact = false if compact && RUBY_VERSION < "3.3"
    GC.stress = true
    yield
  ensure
    GC.stress = false
    if compact && !GC.auto_compact
      GC.start # never turn compaction on mid-GC (see the top of this file)
      GC.auto_compact = true
    end
  end

  # The bytes of a gzip stream, uncompressed. Zlib.gunzip before zlib 3.1
  # (Ruby 3.1, 3.2) skips the 10-byte header by characters of the String's
  # encoding: a UTF-8 String (a StringIO's, say) whose header's mtime happens
  # to read as a multi-byte character loses its first deflate bytes
  # (ruby/zlib#55). The seconds when Time.now does that failed whole test
  # classes at random; gzip data is binary, so it is read as binary.
  def gunzip(bytes)
    Zlib.gunzip(bytes.b)
  end

  # Runs Ruby code for this long by the monotonic clock (what :wall mode
  # samples; a test about CPU time defines its own).
  def spin(seconds)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    nil while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
  end

  # For tests of sampling statistics (rates, shares between threads):
  # under `rake test:valgrind` the process runs some 50 times slower and
  # valgrind runs one thread at a time, so the statistics cannot hold; the
  # memory checking is what that run is for.
  #
  # Such a test also measures the machine, so it runs alone: see QuietLock.
  def skip_statistics_under_valgrind
    skip "sampling statistics do not hold under valgrind (one thread at a time, 50x slower)" if ENV["STROBE_UNDER_VALGRIND"]
    quiet_lock_exclusive
  end

  # For tests that switch fibers: Ruby switches a fiber's machine stack
  # without telling valgrind (Debian's Ruby is not built with RUBY_VALGRIND),
  # so its GC's conservative stack scan then reads what valgrind takes for
  # memory below the stack pointer; plain Ruby with a fiber and a GC does it
  # too (12 such reports for 3,000 Enumerator#next loops, no Strobe loaded).
  def skip_fibers_under_valgrind
    skip "Ruby's fiber stack switches look like invalid reads to valgrind (plain Ruby too)" if ENV["STROBE_UNDER_VALGRIND"]
  end

  # Runs a command in a child process, killed after timeout seconds (a
  # safeguard against a hang, not a timing check): [stdout, stderr, status].
  # It runs in its own process group, so a hang kills what it forked too.
  # Other options go to Process.spawn (rlimit_as:, say).
  def run_command(env, *command, chdir: Dir.pwd, timeout: 120, **spawn)
    Open3.popen3(env, *command, chdir: chdir, pgroup: true, **spawn) do |stdin, stdout, stderr, wait|
      stdin.close
      out = Thread.new { stdout.read }
      err = Thread.new { stderr.read }
      unless wait.join(timeout)
        Process.kill(:KILL, -wait.pid)
        [out, err].each { |reader| reader.join(5) } # before the streams close under them
        flunk "#{command.join(' ')} did not finish within #{timeout}s"
      end
      [out.value, err.value, wait.value]
    end
  end

  # Polls until the block is true: a safeguard against a hang, not a timing
  # check; the failure shows context.call.
  def wait_until(seconds, context = -> { "" })
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    until yield
      flunk "gave up after #{seconds} s waiting; so far:\n#{context.call}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      sleep 0.05
    end
  end

  # Runs another program (dot, callgrind_annotate, chromium) without the
  # sanitizer runtime `rake test:asan` preloads into this process.
  def run_tool(*command, timeout: 120)
    run_command({ "LD_PRELOAD" => nil, "ASAN_OPTIONS" => nil, "UBSAN_OPTIONS" => nil }, *command, timeout: timeout)
  end

  CHROMIUM = %w[chromium chromium-browser google-chrome].map { |c| `command -v #{c} 2>/dev/null`.strip }
                                                       .find { |p| !p.empty? }

  # The DOM of url after headless Chromium ran its scripts for a while
  # (virtual time: as long as the page keeps working). With console: true,
  # [DOM, the page's console output].
  def chromium_dom(url, console: false)
    assert CHROMIUM, "chromium is needed for this test (.ci/run installs Debian's chromium)"
    Dir.mktmpdir do |profile_dir|
      logging = console ? ["--enable-logging=stderr", "--v=0"] : []
      out, err, status = run_tool(CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                  "--user-data-dir=#{profile_dir}", *logging, "--virtual-time-budget=5000",
                                  "--dump-dom", url, timeout: 120)
      assert status.success?, "chromium failed: #{err[0, 300]}"
      console ? [out, err.scan(/INFO:CONSOLE[^"]*"(.*)", source/).flatten] : out
    end
  end

  # Runs Ruby code in a child process with Strobe loadable.
  def run_ruby(code, timeout: 60, env: {}, ruby_args: [], args: [])
    run_command(env, RbConfig.ruby, *ruby_args, "-I#{ENV['STROBE_LIB'] || LIB}", "-I#{LIB}", "-e", code, *args,
                timeout: timeout)
  end

  # The web-application gems (ActiveSupport...) that `rake deps` installs
  # apart from the suite's: programs started with app_gems_env see them.
  APP_GEMS_HOME = File.join(ROOT, "tmp/app-gems", RUBY_VERSION)

  def app_gems_env
    unless File.directory?(File.join(APP_GEMS_HOME, "gems"))
      flunk "#{APP_GEMS_HOME} is missing: `rake deps` installs the application gems these tests run"
    end
    unbundled_env.merge("GEM_PATH" => [APP_GEMS_HOME, *Gem.path].join(File::PATH_SEPARATOR))
  end

  # Under `bundle exec rake test`, the changes to the environment that would
  # hold a child to the bundle (RUBYOPT's -rbundler/setup, BUNDLE_GEMFILE...)
  # undone: the application gems are not in it.
  def unbundled_env
    return {} unless defined?(Bundler) && Bundler.respond_to?(:unbundled_env)

    clean = Bundler.unbundled_env
    ENV.keys.union(clean.keys).to_h { |key| [key, clean[key]] }.reject { |key, value| ENV[key] == value }
  end

  # Runs Ruby code in a child process and checks that it exits 0 having
  # printed exactly expected.
  def assert_ruby_prints(expected, code, timeout: 60, ruby_args: [])
    out, err, status = run_ruby(code, timeout: timeout, ruby_args: ruby_args)
    assert status.success?, "exit status #{status.inspect}, stderr: #{err[0, 400]}"
    assert_equal expected, out, "stderr: #{err[0, 600]}"
  end

  # The frame rows of a text report (after its header, which may carry
  # extra lines such as thread states), sorted: stackprof's order of equal
  # counts is unspecified.
  def table_rows(text)
    text.lines.drop_while { |line| !line.include?("TOTAL") }.drop(1).sort
  end

  # Frames of a result by name: {name => frame}. Names must be unique.
  def frames_by_name(result)
    result[:frames].values.to_h { |f| [f[:name], f] }
  end

  def frame_id(result, name)
    ids = result[:frames].select { |_, f| f[:name] == name }.keys
    assert_equal 1, ids.size, "expected one frame named #{name}, got #{ids.size}"
    ids.first
  end
end

# .ci/run runs two suites at once, one per core, both given one lock file
# (STROBE_TEST_LOCK). Every test holds it shared while it runs; a test of
# sampling statistics (shares between threads, ticks missed) holds it
# alone, so no test of the other suite runs beside it: a competing
# CPU-bound process starves the timer thread and moves those figures by
# points (issue 32), which is what they would then measure.
module QuietLock
  def before_setup
    super
    path = ENV["STROBE_TEST_LOCK"]
    return if path.nil? || path.empty?

    @quiet_lock = File.open(path, File::RDWR | File::CREAT, 0o600)
    @quiet_lock.flock(File::LOCK_SH)
  end

  def quiet_lock_exclusive
    @quiet_lock&.flock(File::LOCK_EX)
  end

  def after_teardown
    @quiet_lock&.close
    @quiet_lock = nil
    super
  end
end

class Minitest::Test
  include StrobeTestHelpers
  include QuietLock

  # A test that fails mid-profile must not leave the next one running.
  def teardown
    return unless Strobe.running?

    Strobe.stop
    Strobe.results
  end
end
