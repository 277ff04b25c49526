# frozen_string_literal: true

require "test_helper"
require "stackprof"
require "tmpdir"
require "json"

# require "strobe/stackprof": stackprof 0.2.27's API run by Strobe. The
# behaviours of stackprof's own test suite (test_stackprof.rb,
# test_report.rb, test_middleware.rb), each checked in a child process
# (this process has the real stackprof loaded, which the drop-in refuses to
# replace), plus what the drop-in adds.
class TestStackprofDropin < Minitest::Test
  PRELUDE = <<~RUBY
    require "strobe/stackprof"
    require "stringio"
    # At least 20 ms of CPU: 250,000 iterations alone took under one 1 ms
    # interval under a JIT, and a :cpu profile of it came out empty.
    def math
      deadline = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) + 0.02
      250_000.times { 2**10 } while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) < deadline
    end
  RUBY

  # Runs code after PRELUDE in a child; returns its standard output lines.
  def dropin(code, timeout: 60, env: {})
    out, err, status = run_ruby(PRELUDE + code, timeout: timeout, env: env)
    assert status.success?, "exit status #{status.inspect}, stderr: #{err[0, 1500]}"
    out.lines.map(&:chomp)
  end

  def test_info_running_and_start_stop_results_return_values
    lines = dropin(<<~RUBY)
      profile = StackProf.run {}
      p profile.values_at(:version, :mode, :interval, :samples)
      p StackProf.running?
      StackProf.run { p StackProf.running? }
      p StackProf.results
      p [StackProf.start, StackProf.start, StackProf.running?, StackProf.results]
      p [StackProf.stop, StackProf.stop, StackProf.running?]
      p [StackProf.results.class, StackProf.results]
      p [StackProf.sample, StackProf.use_postponed_job!, StackProf::VERSION]
    RUBY
    assert_equal ["[1.2, :wall, 1000, 0]", "false", "true", "nil", "[true, false, true, nil]",
                  "[true, false, false]", "[Hash, nil]", "[false, nil, \"0.2.27\"]"], lines
  end

  def test_result_keys_are_stackprofs
    lines = dropin(<<~RUBY)
      p StackProf.run(mode: :custom) { StackProf.sample }.keys
      p StackProf.run(mode: :custom, raw: true) { StackProf.sample }.keys
    RUBY
    real = StackProf.run(mode: :custom, raw: true) { StackProf.sample }
    assert_equal [%i[version mode interval samples gc_samples missed_samples metadata frames].inspect,
                  real.keys.inspect], lines
  end

  def test_option_errors_as_stackprofs_and_unknown_options_named
    lines = dropin(<<~RUBY)
      def error
        yield
        "no error"
      rescue ArgumentError, TypeError => e
        "\#{e.class}: \#{e.message}"
      end
      [-1, 0, 1_000_000, 1_000_001].each { |i| puts error { StackProf.run(interval: i, debug: true) {} } }
      puts error { StackProf.run(mode: :cpu, metadata: "foobar") {} }
      puts error { StackProf.run(mode: :nope) {} }
      puts error { StackProf.run(mode: "cpu") {} }
      puts error { StackProf.run(interval: "1") {} }
      puts error { StackProf.run(debug: true, colour: 1) {} }
      p [StackProf.running?, StackProf.run(mode: :custom) { StackProf.sample }[:samples]]
    RUBY
    interval = "ArgumentError: interval is a number of microseconds between 1 and 1 million"
    assert_equal [interval] * 4 + ["ArgumentError: metadata should be a hash", "ArgumentError: unknown profiler mode",
                                   "ArgumentError: unknown profiler mode",
                                   "TypeError: no implicit conversion of String into Integer",
                                   "ArgumentError: unknown options: :debug, :colour", "[false, 1]"], lines
  end

  def test_run_without_a_block
    lines = dropin(<<~RUBY)
      begin
        StackProf.run(mode: :custom)
      rescue LocalJumpError => e
        p [e.class, StackProf.running?]
      end
    RUBY
    assert_equal ["[LocalJumpError, false]"], lines
  end

  # Counts are compared with the real stackprof's on the same Ruby: what
  # an allocation is charged to depends on the Ruby (4.0 inlines Class#new,
  # so Object.new's allocation lands in the caller's frame).
  def test_object_mode_counts_and_lines
    code = <<~RUBY
      class Probe
        def allocate_two
          base = __LINE__ + 1
          profile = StackProf.run(mode: :object) do
            Object.new
            Object.new
          end
          frame = profile[:frames].values.first
          p [profile[:mode], profile[:interval], profile[:samples]]
          p [frame[:name], frame[:samples], frame[:line] == base - 2 || frame[:line] == base]
          p [frame[:lines][base + 1], frame[:lines][base + 2], frame[:lines][base]]
        end
      end
      Probe.new.allocate_two
      p StackProf.run(mode: :object, interval: 10) { 100.times { Object.new } }[:samples]
    RUBY
    lines = dropin(code)
    out, err, status = run_ruby("require 'stackprof'\n#{code}")
    assert status.success?, err
    assert_equal out.lines(chomp: true), lines
    # (Under `bundle exec`, Bundler's setup makes Class#new allocate once more
    # in that block, for stackprof as for Strobe: the comparison above holds.)
    assert_equal "[:object, 1, 4]", lines[0] unless defined?(Bundler)
    assert_equal "10", lines[3]
  end

  def test_custom_mode_frames_and_lines
    lines = dropin(<<~RUBY)
      class Probe
        def ten
          base = __LINE__ + 1
          profile = StackProf.run(mode: :custom) do
            10.times do
              StackProf.sample
            end
          end
          first, frame = profile[:frames].values.first(2)
          p [profile[:mode], profile[:samples], first[:name]]
          p [frame[:name], frame[:lines][base + 2]]
        end
      end
      Probe.new.ten
    RUBY
    assert_equal ['[:custom, 10, "StackProf.sample"]', '["Probe#ten", [10, 0]]'], lines
  end

  def test_raw_arrays_and_timestamps
    lines = dropin(<<~RUBY)
      class Probe
        def raw
          before = Process.clock_gettime(Process::CLOCK_MONOTONIC, :microsecond)
          line = __LINE__ + 3
          profile = StackProf.run(mode: :custom, raw: true) do
            10.times do
              StackProf.sample
              sleep 0.0001
            end
          end
          after = Process.clock_gettime(Process::CLOCK_MONOTONIC, :microsecond)
          raw, raw_lines = profile.values_at(:raw, :raw_lines)
          p [raw[-1], raw.size == raw[0] + 2, raw_lines[-1], raw_lines[-3] == line]
          p profile[:frames][raw[-3]][:name]
          stamps = profile[:raw_sample_timestamps]
          deltas = profile[:raw_timestamp_deltas]
          p [stamps.size, stamps.first > before, stamps.each_cons(2).all? { |a, b| b >= a }, stamps.last < after]
          p [deltas.size, deltas.all?(&:positive?), deltas.sum < after - before]
        end
      end
      Probe.new.raw
    RUBY
    assert_equal ["[10, true, 10, true]", '"Probe#raw"', "[10, true, true, true]", "[10, true, true]"], lines
  end

  def test_cpu_and_wall_modes
    lines = dropin(<<~RUBY)
      cpu = StackProf.run(mode: :cpu, interval: 500) { math }
      p [cpu[:samples] >= 1, cpu[:frames].values.take(2).any? { |f| f[:name] == "Object#math" }]
      def idle
        r, w = IO.pipe
        IO.select([r], nil, nil, 0.2)
      ensure
        r.close
        w.close
      end
      GC.disable
      wall = StackProf.run(mode: :wall) { idle }
      frame = wall[:frames].values.first
      p [frame[:name], frame[:samples] * 2 > wall[:samples], wall[:samples] > 20]
    RUBY
    assert_equal ["[true, true]", '["IO.select", true, true]'], lines
  end

  # :wall samples the thread that started profiling, as stackprof's timer
  # does; :cpu every thread that runs.
  def test_wall_mode_samples_the_starting_thread_only
    lines = dropin(<<~RUBY)
      def worker_nap = sleep(0.4)
      def main_nap = sleep(0.2)
      worker = Thread.new { worker_nap }
      sleep 0.02
      profile = StackProf.run(mode: :wall) { main_nap }
      worker.join
      names = profile[:frames].values.map { |f| f[:name] }
      p [names.include?("Object#main_nap"), names.include?("Object#worker_nap"), profile[:samples] > 20]
    RUBY
    assert_equal ["[true, false, true]"], lines
  end

  def test_metadata
    lines = dropin(<<~RUBY)
      metadata = { path: "/foo/bar", revision: "5c0b01f1522ae8c194510977ae29377296dd236b" }
      p StackProf.run(mode: :cpu, metadata: metadata) { math }[:metadata] == metadata
      p StackProf.run(mode: :cpu) { math }[:metadata]
    RUBY
    assert_equal ["true", "{}"], lines
  end

  def test_fork_child_is_not_profiling
    lines = dropin(<<~RUBY)
      StackProf.run do
        pid = fork { exit! StackProf.running? ? 1 : 0 }
        Process.wait(pid)
        p [$?.exitstatus, StackProf.running?]
      end
    RUBY
    assert_equal ["[0, true]"], lines
  end

  def test_recursion_counts_once_in_total_samples
    lines = dropin(<<~RUBY)
      def foo(n = 10)
        return StackProf.sample if n.zero?

        foo(n - 1)
      end
      profile = StackProf.run(mode: :cpu, raw: true) { 10.times { foo } }
      p profile[:frames].values.find { |f| f[:name] == "Object#foo" }[:total_samples]
    RUBY
    assert_equal ["10"], lines
  end

  def test_gc_frames
    lines = dropin(<<~RUBY)
      garbage = Array.new(200_000) { |i| [i.to_s] }
      profile = StackProf.run(interval: 100, raw: true) { 5.times { GC.start } }
      gc, marking, sweeping = ["(garbage collection)", "(marking)", "(sweeping)"].map do |name|
        profile[:frames].values.find { |f| f[:name] == name }
      end
      # Sweeping a heap can take less than one interval: its frame may be absent.
      p [!gc.nil?, !marking.nil?, profile[:gc_samples] > 0]
      p (gc[:total_samples] - profile[:gc_samples]).abs <= 2
      p (profile[:gc_samples] - [gc, marking, sweeping].compact.sum { |f| f[:samples] }).abs <= 2
      p garbage.size
    RUBY
    assert_equal ["[true, true, true]", "true", "true", "200000"], lines
  end

  # results(out) and the out: option write stackprof's Marshal dump and
  # return the IO (or the File opened on the path); the real stackprof reads
  # the dumps.
  def test_out_writes_marshal_dumps_the_real_stackprof_reads
    Dir.mktmpdir do |dir|
      lines = dropin(<<~RUBY)
        require "tempfile"
        require "pathname"
        tmp = Tempfile.new("stackprof-out")
        ret = StackProf.run(mode: :custom, out: tmp) { StackProf.sample }
        tmp.rewind
        p [tmp == ret, Marshal.load(tmp.read)[:frames].empty?]
        ret = StackProf.run(mode: :custom, out: "#{dir}/a.dump") { StackProf.sample }
        p [ret.class, ret.path]
        ret = StackProf.run(mode: :custom, out: Pathname.new("#{dir}/b.dump")) { StackProf.sample }
        p ret.path
        StackProf.run(mode: :cpu, raw: true, out: "#{dir}/c.dump") { math }
        StackProf.start(mode: :custom, raw: true)
        3.times { StackProf.sample }
        StackProf.stop
        p StackProf.results("#{dir}/d.dump").path
      RUBY
      assert_equal ["[true, false]", "[File, \"#{dir}/a.dump\"]", "\"#{dir}/b.dump\"", "\"#{dir}/d.dump\""], lines
      real = StackProf::Report.from_file("#{dir}/c.dump")
      out = StringIO.new
      real.print_text(false, nil, nil, nil, nil, nil, out)
      assert_match(/Object#math/, out.string)
      assert_equal 3, StackProf::Report.from_file("#{dir}/d.dump").data[:samples]
      assert_equal real.data[:raw].size, real.data[:raw_lines].size
    end
  end

  # A dump's path and the middleware's files are saved as every file of
  # Strobe's (AtomicFile): readable by their owner only, and a FIFO at the
  # path that nobody reads is an error, not a wait for good (the drop-in
  # opened paths with File.open: mode 0644 under umask 022, and a planted
  # FIFO held the program).
  def test_dumps_are_saved_as_strobe_saves_files
    Dir.mktmpdir do |dir|
      File.mkfifo("#{dir}/fifo.dump")
      lines = dropin(<<~RUBY, timeout: 30)
        File.umask(0o022)
        StackProf.run(mode: :custom, out: "#{dir}/a.dump") { StackProf.sample }
        app = ->(env) { [200, {}, ["ok"]] }
        StackProf::Middleware.new(app, path: "#{dir}/mw/", save_every: 1, enabled: true).call({})
        begin
          StackProf.run(mode: :custom, out: "#{dir}/fifo.dump") { StackProf.sample }
        rescue SystemCallError => e
          p e.class
        end
      RUBY
      assert_equal ["Strobe::AtomicFile::Unread"], lines
      assert_equal 0o600, File.stat("#{dir}/a.dump").mode & 0o777
      saved = Dir.glob("#{dir}/mw/*.dump")
      assert_equal [0o600], saved.map { |f| File.stat(f).mode & 0o777 }
    end
  end

  # And the other way: the real stackprof's dumps in the drop-in's Report.
  def test_the_real_stackprofs_dumps_load_when_asked
    Dir.mktmpdir do |dir|
      StackProf.run(mode: :custom, raw: true, out: "#{dir}/real.dump") { 4.times { StackProf.sample } }.close
      lines = dropin(<<~RUBY)
        report = StackProf::Report.from_file("#{dir}/real.dump", marshal: true)
        text = StringIO.new
        report.print_text(false, nil, nil, nil, nil, nil, text)
        puts text.string.lines.grep(/StackProf.sample/)
        $stdout.flush
        report.print_stackcollapse
      RUBY
      assert_match(/\A +4 +\(100\.0%\) +4 +\(100\.0%\) +StackProf\.sample\z/, lines[0])
      assert_match(/;StackProf\.sample 4\z/, lines[1])
    end
  end

  def test_the_real_stackprof_loaded_first_is_refused
    code = <<~RUBY
      require "stackprof"
      begin
        require "strobe/stackprof"
      rescue LoadError => e
        puts e.message
      end
    RUBY
    out, _, status = run_ruby(code)
    assert status.success?
    assert_match(/the stackprof gem is already loaded/, out)
  end

  # A library that requires stackprof itself, loaded after the drop-in,
  # gets the drop-in; the gem's own files loaded anyway (by path) are
  # refused at their first method, with the drop-in kept.
  def test_require_stackprof_after_the_dropin_loads_the_dropin
    Dir.mktmpdir do |dir|
      File.write(File.join(dir, "uses_stackprof.rb"), <<~RUBY)
        require "stackprof"
        require "stackprof/report"
        require "stackprof/middleware"
        module UsesStackprof
          def self.profile(&block)
            StackProf::Report.new(StackProf.run(mode: :cpu, raw: true, &block))
          end
        end
      RUBY
      gem_file = Gem::Specification.find_by_name("stackprof", "0.2.27").full_gem_path + "/lib/stackprof.rb"
      lines = dropin(<<~RUBY, env: { "RUBYLIB" => dir })
        p require("stackprof")
        require "uses_stackprof"
        p [StackProf::STROBE, StackProf::Middleware.name, $LOADED_FEATURES.grep(%r{/gems/stackprof-}).size]
        report = UsesStackprof.profile { math }
        out = StringIO.new
        report.print_text(false, nil, nil, nil, nil, nil, out)
        puts out.string.lines.any? { |l| l.split.last == "Object#math" } ? "math reported" : out.string.inspect
        begin
          load #{gem_file.dump}
        rescue LoadError => e
          puts e.message
        end
        p StackProf.run(mode: :custom) { StackProf.sample }[:samples]
      RUBY
      assert_equal "true", lines[0]
      assert_equal [Strobe::VERSION, "StackProf::Middleware", 0].inspect, lines[1]
      assert_equal "math reported", lines[2]
      assert_match(%r{loaded after strobe/stackprof}, lines[3])
      assert_equal "1", lines[4]
    end
  end

  # --- StackProf::Report ------------------------------------------------------

  def test_report_dump_and_from_file
    Dir.mktmpdir do |dir|
      File.write("#{dir}/profile.json", '{"mode":"cpu"}')
      File.binwrite("#{dir}/profile.dump", Marshal.dump({ mode: "cpu" }))
      lines = dropin(<<~RUBY)
        out = StringIO.new
        StackProf::Report.new({}).print_dump(out)
        p Marshal.load(out.string)
        p StackProf::Report.from_file("#{dir}/profile.json").data
        begin
          StackProf::Report.from_file("#{dir}/profile.dump")
        rescue Strobe::ProfileError => e
          puts e.message
        end
        p StackProf::Report.from_file("#{dir}/profile.dump", marshal: true).data
        File.write("#{dir}/bad.json", '{"mode":')
        begin
          StackProf::Report.from_file("#{dir}/bad.json")
        rescue Strobe::ProfileError => e
          puts e.message
        end
      RUBY
      assert_equal ["{}", { mode: "cpu" }.inspect], lines.first(2)
      assert_match(/profile\.dump: a Marshal dump; .*marshal: true/, lines[2])
      assert_equal({ mode: "cpu" }.inspect, lines[3])
      assert_match(/bad\.json: not valid JSON/, lines[4])
    end
  end

  def test_report_methods_with_stackprofs_arguments
    lines = dropin(<<~RUBY)
      profile = StackProf.run(mode: :custom, raw: true) do
        def leaf(n) = n.times { StackProf.sample }
        def mid = leaf(3)
        def top = [mid, leaf(2)]
        top
      end
      report = StackProf::Report.new(profile)
      text = StringIO.new
      report.print_text(false, 2, nil, nil, nil, nil, text)
      ours = StringIO.new
      Strobe::Report.new(profile).print_text(ours, limit: 2)
      p text.string == ours.string
      text = StringIO.new
      report.print_text(true, nil, nil, nil, [/leaf|mid/], nil, text)
      p text.string.lines.grep(/Object#/).map { |l| l.split.last }
      method = StringIO.new
      report.print_method("mi", method)
      report.print_method("no_such_method", method)
      p method.string.lines.first.split.first
      p method.string.scan(/^Object#/).size
      dot = StringIO.new
      report.print_graphviz({ limit: 2 }, dot)
      p dot.string.scan(/label="([^\\\\"]+)\\\\n/).flatten.size
      dot = StringIO.new
      report.print_graphviz({ filter: /Object#leaf/ }, dot)
      p dot.string.scan(/label="([^\\\\"]+)\\\\n/).flatten.sort
      p [report.overall_samples, report.max_samples, report.modeline, report.version]
      p report.frames(true).values.first[:total_samples] == 5
      p report.normalized_frames.keys.all? { |k| k.match?(/\\A\\h{64}\\z/) }
      raw_before = profile[:raw].dup
      $stdout = StringIO.new
      report.print_stackcollapse
      folded, $stdout = $stdout.string, STDOUT
      p [folded.lines.sort.map { |l| l.split(";").last.strip }, profile[:raw] == raw_before]
      html = StringIO.new
      report.print_timeline_flamegraph(html)
      p html.string.include?('"view":"timeline"')
      html = StringIO.new
      report.print_d3_flamegraph(html)
      p html.string.include?('"view":"aggregated"')
      calls = StringIO.new
      report.print_callgrind(calls)
      p calls.string.start_with?("# callgrind format")
      sum = report + StackProf::Report.new(profile)
      p [sum.overall_samples, sum.data[:frames].values.find { |f| f[:name] == "StackProf.sample" }[:samples]]
      other = StackProf::Report.new(StackProf.run(mode: :object) { Object.new })
      begin
        report + other
      rescue ArgumentError => e
        puts e.message
      end
      begin
        StackProf::Report.new(StackProf.run(mode: :custom) { StackProf.sample }).print_stackcollapse
      rescue RuntimeError => e
        puts e.message
      end
    RUBY
    assert_equal "true", lines[0], "print_text is Strobe's table"
    assert_equal '["Object#leaf", "Object#mid"]', lines[1]
    assert_equal ['"Object#mid"', "1"], lines[2, 2], "a part of the name; nothing for no match"
    assert_equal "2", lines[4]
    # stackprof's filter: leaf, and the callees that get nearly all their
    # samples from it (at least 1/1.2), and theirs.
    assert_equal '["Integer#times", "Object#leaf", "StackProf.sample"]', lines[5]
    assert_equal '[5, 5, "custom()", 1.2]', lines[6]
    assert_equal %w[true true], lines[7, 2]
    assert_equal '[["StackProf.sample 2", "StackProf.sample 3"], true]', lines[9], "folded, raw left as it was"
    assert_equal %w[true true true], lines[10, 3]
    assert_equal "[10, 10]", lines[13]
    assert_equal "cannot combine custom() with object(1)", lines[14]
    assert_match(/profile does not include raw samples/, lines[15])
  end

  def test_report_files_and_file
    Dir.mktmpdir do |dir|
      path = File.join(dir, "work.rb")
      File.write(path, <<~RUBY)
        def work
          StackProf.sample
          StackProf.sample
        end
      RUBY
      lines = dropin(<<~RUBY)
        load #{path.inspect}
        report = StackProf::Report.new(StackProf.run(mode: :custom) { work })
        files = StringIO.new
        report.print_files(false, nil, files)
        p files.string.include?("work.rb")
        p report.files.keys.include?(#{path.inspect})
        source = StringIO.new
        report.print_file("work", source)
        puts source.string
      RUBY
      assert_equal %w[true true], lines.first(2)
      assert(lines.any? { |l| l.include?("StackProf.sample") && l.include?("|") }, lines.join("\n"))
    end
  end

  # --- StackProf::Middleware ----------------------------------------------------

  def test_middleware_settings_as_stackprofs
    lines = dropin(<<~RUBY)
      StackProf::Middleware.new(Object.new)
      p StackProf::Middleware.path
      StackProf::Middleware.new(Object.new, { path: "foo/" })
      p StackProf::Middleware.path
      StackProf::Middleware.new(Object.new, enabled: proc { false })
      p StackProf::Middleware.enabled?({})
      StackProf::Middleware.new(Object.new, enabled: proc { |env| env["PROFILE"] })
      p [StackProf::Middleware.enabled?(Hash.new { false }), StackProf::Middleware.enabled?(Hash.new { true })]
      StackProf::Middleware.new(Object.new, raw: true, metadata: { key: "value" })
      p [StackProf::Middleware.raw, StackProf::Middleware.metadata, StackProf::Middleware.mode, StackProf::Middleware.interval]
    RUBY
    assert_equal ['"tmp/"', '"foo/"', "false", "[false, true]", [true, { key: "value" }, :cpu, 1000].inspect], lines
  end

  def test_middleware_saves_dumps_named_as_stackprofs
    Dir.mktmpdir do |dir|
      lines = dropin(<<~RUBY)
        p Process.pid
        Dir.chdir(#{dir.inspect}) do
          app = ->(env) { 100.times { Object.new }; [200, {}, ["ok"]] }
          StackProf::Middleware.new(app, save_every: 1, enabled: true).call({})
          StackProf::Middleware.new(app, path: "foo/", save_every: 1, enabled: true).call({})
          StackProf::Middleware.new(app, path: "one/file.dump", save_every: 2, enabled: true, mode: :object,
                                         interval: 1).tap do |m|
            m.call({})
            p File.exist?("one/file.dump")
            m.call({})
          end
        end
      RUBY
      pid = lines.shift
      assert_equal ["false"], lines, "save_every: 2 saves after the second request"
      %w[tmp foo].each do |sub|
        names = Dir.children(File.join(dir, sub))
        assert_equal 1, names.size
        assert_match(/\Astackprof-cpu-#{pid}-\d+\.dump\z/, names.first)
      end
      dump = StackProf::Report.from_file(File.join(dir, "one/file.dump"))
      assert_equal :object, dump.data[:mode]
      assert_operator dump.data[:samples], :>=, 200, "two requests of 100 allocations, every one sampled"
    end
  end

  # A Rack app that used StackProf::Middleware runs unchanged: Rack::Lint
  # on both sides, the response untouched, the dump readable by stackprof.
  def test_rack_app_with_the_middleware_runs_unchanged
    Dir.mktmpdir do |dir|
      lines = dropin(<<~RUBY)
        require "rack"
        require "rack/lint"
        require "rack/mock"
        require "rack/builder"
        hello = ->(env) { 20_000.times { |i| i.to_s }; [200, { "Content-Type" => "text/plain" }, ["hello \#{env["PATH_INFO"]}"]] }
        app = Rack::Builder.new do
          use Rack::Lint
          use StackProf::Middleware, enabled: ->(env) { env["QUERY_STRING"].include?("profile") },
                                     mode: :wall, interval: 500, raw: true, save_every: 2, path: #{"#{dir}/".inspect}
          use Rack::Lint
          run hello
        end.to_app # built once, as a server does
        request = Rack::MockRequest.new(app)
        3.times do |i|
          response = request.get("/page\#{i}", params: { "profile" => "1" })
          p [response.status, response.body, response["Content-Type"]]
        end
        p request.get("/plain").body
        # Profiling that cannot start (Strobe busy elsewhere) leaves the request alone.
        Strobe.start(mode: :custom)
        p request.get("/busy", params: { "profile" => "1" }).body
        Strobe.stop
        Strobe.results
        StackProf::Middleware.mode = :bogus
        p request.get("/bogus", params: { "profile" => "1" }).body
      RUBY
      assert_equal ['[200, "hello /page0", "text/plain"]', '[200, "hello /page1", "text/plain"]',
                    '[200, "hello /page2", "text/plain"]', '"hello /plain"', '"hello /busy"', '"hello /bogus"'], lines
      dumps = Dir.glob(File.join(dir, "stackprof-wall-*.dump"))
      assert_equal 1, dumps.size, "one dump after two profiled requests"
      report = StackProf::Report.from_file(dumps.first)
      assert_equal :wall, report.data[:mode]
      assert_operator report.data[:samples], :>, 0
      assert report.data[:raw]
    end
  end

  # --- autorun -------------------------------------------------------------------

  def test_autorun_environment_variables
    Dir.mktmpdir do |dir|
      out_path = File.join(dir, "auto.dump")
      env = { "RUBYOPT" => "-rstrobe/stackprof/autorun", "STACKPROF_MODE" => "cpu", "STACKPROF_INTERVAL" => "500",
              "STACKPROF_RAW" => "1", "STACKPROF_OUT" => out_path }
      out, err, status = run_command(env, RbConfig.ruby, "-I#{ENV['STROBE_LIB'] || LIB}", "-I#{LIB}", "-e",
                                     "def busy = 1_000_000.times { |i| i.to_s }; busy")
      assert status.success?, err
      assert_equal "", out
      assert_includes err, "StackProf results dumped at: #{out_path}"
      dump = StackProf::Report.from_file(out_path).data
      assert_equal [:cpu, 500], dump.values_at(:mode, :interval)
      assert dump[:raw]
      assert(dump[:frames].values.any? { |f| f[:name] == "Object#busy" })
    end
  end
end
