# frozen_string_literal: true

require_relative "test_helper"
require_relative "protobuf_reader"
require_relative "pyroscope_receiver"
require "json"
require "strobe/continuous"

# Continuous profiling pushed to a Pyroscope stand-in on 127.0.0.1 that
# parses requests as the server does (PyroscopeReceiver): what each upload
# holds, what is counted when the store fails, forked workers, autorun.
class TestContinuous < Minitest::Test
  include ProtobufReader

  # A child program: profiles continuously to url for `seconds` of CPU
  # work in fib (with options), then stops and prints the stats as JSON.
  def run_child(url, seconds: 3, options: "", work: nil, timeout: 90, env: {})
    code = <<~RUBY
      require "strobe/continuous"
      require "json"
      def fib(n) = n < 2 ? n : fib(n - 1) + fib(n - 2)
      session = Strobe::Continuous.start(url: #{url.inspect}, service_name: "shop", upload_every: 1,
                                         overhead_target: false, labels: { region: "eu" }#{options})
      abort "not started" unless session
      t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      #{work || 'fib(20) while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t < ' + seconds.to_s}
      $stdout.puts JSON.generate(Strobe::Continuous.stop)
    RUBY
    out, err, status = run_ruby(code, timeout: timeout, env: env)
    assert status.success?, "the child failed: #{err}"
    [JSON.parse(out.lines.last, symbolize_names: true), err]
  end

  def samples_of(upload)
    profile(upload.profile)[:samples].sum { |s| s[:values].first }
  end

  def test_each_window_is_an_upload_the_server_takes_with_its_labels
    receiver = PyroscopeReceiver.new
    stats, err = run_child(receiver.url)
    uploads = receiver.all_uploads
    assert_empty err
    assert_operator uploads.size, :>=, 2, "a window a second for 3 s"
    assert_equal stats[:windows], uploads.size
    assert_equal stats[:uploaded], uploads.size
    assert_equal 0, stats[:dropped]

    uploads.each do |upload|
      assert_equal "/ingest", upload.path
      assert_equal "pprof", upload.params["format"]
      assert_equal "strobe", upload.params["spyName"]
      assert_equal "100", upload.params["sampleRate"]
      assert_equal "application/octet-stream", upload.headers["content-type"]
      assert_equal "shop.cpu", upload.app
      labels = upload.labels
      assert_equal "shop", labels["service_name"]
      assert_equal "eu", labels["region"]
      assert_equal Socket.gethostname, labels["hostname"]
      assert_match(/\A\d+\z/, labels["pid"])
      assert_equal RUBY_VERSION, labels["ruby_version"]
      assert_equal Strobe::VERSION, labels["strobe_version"]
      assert_equal "100", labels["sample_rate"]
      assert_operator upload.params["from"].to_i, :<=, upload.params["until"].to_i
      prof = profile(upload.profile)
      assert_equal [%w[samples count], %w[cpu nanoseconds]], prof[:sample_types]
      assert_equal 10_000_000, prof[:period]
      now = Time.now.to_r * 1e9
      assert_operator prof[:time_nanos], :>, now - 3600e9, "within the hour Pyroscope takes"
      threads = prof[:samples].map { |s| s[:labels].to_h["thread"] }.uniq
      refute_includes threads, nil, "every sample names its thread"
    end
    # The windows follow each other: each begins where the one before ended,
    # so together they are the profile of the whole span.
    uploads.each_cons(2) { |a, b| assert_equal a.params["until"], b.params["from"] }
    assert_equal stats[:samples], uploads.sum { |u| samples_of(u) }, "every sample is in one window"
    assert(uploads.all? { |u| profile(u.profile)[:functions].values.any? { |f| f[:name] == "Object#fib" } })
  ensure
    receiver&.stop
  end

  def test_go_tool_pprof_reads_an_upload
    receiver = PyroscopeReceiver.new
    run_child(receiver.url, seconds: 2)
    upload = receiver.all_uploads.max_by { |u| samples_of(u) }
    Dir.mktmpdir do |dir|
      path = File.join(dir, "window.pb")
      File.binwrite(path, upload.profile)
      out, err, status = run_tool("go", "tool", "pprof", "-top", path)
      assert status.success?, "go tool pprof failed: #{err}"
      assert_match(/Type: cpu/, out)
      assert_match(/Object#fib/, out)
      tags, err, status = run_tool("go", "tool", "pprof", "-tags", path)
      assert status.success?, "go tool pprof -tags failed: #{err}"
      assert_match(/thread: Total/, tags)
    end
  ensure
    receiver&.stop
  end

  # Under Strobe::Continuous::Endpoints, samples taken while a request ran
  # carry its endpoint: its route (a framework's, here as Sinatra sets it),
  # never a path the client chose (issue 30, item 8).
  def test_requests_give_samples_their_endpoint
    receiver = PyroscopeReceiver.new
    work = <<~RUBY
      require "strobe/continuous/endpoints"
      app = Strobe::Continuous::Endpoints.new(lambda do |env|
        env["sinatra.route"] = "GET /items/:id" if env["PATH_INFO"].start_with?("/items/")
        s = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        fib(20) while Process.clock_gettime(Process::CLOCK_MONOTONIC) - s < 0.7
        [200, {}, []]
      end)
      %w[/items/42 /reset_password/QwErTyUiOpAsDfGhJkL /users/jane.doe/medical-records].each do |path|
        app.call("REQUEST_METHOD" => "GET", "PATH_INFO" => path)
      end
    RUBY
    run_child(receiver.url, work: work)
    endpoints = Hash.new(0)
    receiver.all_uploads.each do |u|
      profile(u.profile)[:samples].each { |s| endpoints[s[:labels].to_h["endpoint"]] += s[:values].first }
    end
    assert_operator endpoints["GET /items/:id"], :>, 0, "samples of the routed request: #{endpoints}"
    assert_operator endpoints["GET (unrouted)"], :>, 0, "samples of the others: #{endpoints}"
    assert_equal ["GET (unrouted)", "GET /items/:id"], endpoints.keys.compact.sort, "no path as it came"
  ensure
    receiver&.stop
  end

  def test_a_failing_store_costs_bounded_memory_and_counts_what_it_drops
    receiver = PyroscopeReceiver.new(:error)
    # Until five windows are cut (a second each; a loaded machine cuts them
    # late), within 60 s.
    work = <<~RUBY
      most = 0
      until Strobe::Continuous.stats[:windows] >= 5 || Process.clock_gettime(Process::CLOCK_MONOTONIC) - t > 60
        fib(18)
        most = [most, Strobe::Continuous.stats[:queued]].max
      end
      $stderr.puts "most queued: \#{most}"
    RUBY
    stats, err = run_child(receiver.url, work: work, options: ", flush_timeout: 1")
    most = err[/most queued: (\d+)/, 1].to_i
    assert_operator most, :<=, Strobe::Continuous::Uploader::CAPACITY
    assert_operator stats[:windows], :>=, 5
    assert_operator stats[:dropped], :>=, 1
    assert_equal 0, stats[:uploaded]
    assert_equal stats[:windows], stats[:dropped] + stats[:rejected], "every window is counted: #{stats}"
    assert_match(/HTTP 500 store unavailable/, stats[:last_error])
    # Backoff: a few attempts, not one per window and retry.
    assert_operator receiver.attempts, :<, stats[:windows] + 3
    assert_equal 1, err.scan("could not upload a profile").size, "said once: #{err}"
  ensure
    receiver&.stop
  end

  def test_a_store_that_is_down_or_hangs_never_holds_the_program
    closed = TCPServer.new("127.0.0.1", 0)
    down = "http://127.0.0.1:#{closed.addr[1]}"
    closed.close
    hanging = PyroscopeReceiver.new(:hang)
    [down, hanging.url].each do |url|
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      stats, err = run_child(url, seconds: 2, options: ", timeout: 1, flush_timeout: 1")
      took = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
      assert_equal 0, stats[:uploaded]
      assert_operator stats[:failures], :>=, 1
      assert_equal stats[:windows], stats[:dropped] + stats[:rejected], stats.to_s
      assert_match(/could not upload a profile/, err)
      assert_operator took, :<, 30, "a hung store is given up at the deadlines"
    end
  ensure
    hanging&.stop
  end

  def test_forked_workers_each_upload_their_own_windows
    receiver = PyroscopeReceiver.new
    # Under ASan the forks are spaced: GCC 12's libasan has no fork
    # handlers for its allocator, and Ruby starts a thread in the parent
    # after each fork; a child forked while that thread's start holds an
    # allocator lock hangs in its first thread start (seen 1 run in 6).
    gap = ENV["LD_PRELOAD"].to_s.include?("libasan") ? 0.5 : 0
    work = <<~RUBY
      pids = 2.times.map do
        sleep #{gap}
        fork do
          w = Process.clock_gettime(Process::CLOCK_MONOTONIC)
          fib(20) while Process.clock_gettime(Process::CLOCK_MONOTONIC) - w < 2.5
          $stdout.puts "worker \#{Process.pid} \#{Strobe::Continuous.running?}"
          $stdout.flush
        end
      end
      pids.each { |pid| Process.wait(pid) }
    RUBY
    out, err, status = run_ruby(<<~RUBY, timeout: 90)
      require "strobe/continuous"
      require "json"
      def fib(n) = n < 2 ? n : fib(n - 1) + fib(n - 2)
      Strobe::Continuous.start(url: #{receiver.url.inspect}, service_name: "shop", upload_every: 1, overhead_target: false)
      t = 0
      #{work}
      $stdout.puts JSON.generate(Strobe::Continuous.stop)
    RUBY
    assert status.success?, err
    workers = out.scan(/worker (\d+) true/).flatten
    assert_equal 2, workers.size, out
    by_pid = receiver.all_uploads.group_by { |u| u.labels["pid"] }
    workers.each do |pid|
      assert by_pid[pid], "worker #{pid} uploads its own windows: #{by_pid.keys}"
      assert(by_pid[pid].any? { |u| samples_of(u).positive? })
    end
  ensure
    receiver&.stop
  end

  # Issue 30: Process.daemon forks without Process._fork; the daemon keeps
  # profiling, as its own process.
  def test_a_daemonized_process_keeps_its_session
    receiver = PyroscopeReceiver.new
    gap = ENV["LD_PRELOAD"].to_s.include?("libasan") ? 0.5 : 0 # (as in the forked workers' test)
    Dir.mktmpdir do |dir|
      code = <<~RUBY
        require "strobe/continuous"
        require "json"
        def fib(n) = n < 2 ? n : fib(n - 1) + fib(n - 2)
        $stdout.reopen(File.join(#{dir.inspect}, "out"), "w")
        $stderr.reopen(File.join(#{dir.inspect}, "err"), "w")
        Strobe::Continuous.start(url: #{receiver.url.inspect}, service_name: "daemon", upload_every: 1,
                                 overhead_target: false)
        sleep #{gap}
        Process.daemon(true, true)
        t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        fib(20) while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t < 3
        stats = Strobe::Continuous.stop
        File.write(File.join(#{dir.inspect}, "done.tmp"), JSON.generate(pid: Process.pid, stats: stats))
        File.rename(File.join(#{dir.inspect}, "done.tmp"), File.join(#{dir.inspect}, "done"))
      RUBY
      _, err, status = run_ruby(code, timeout: 30)
      assert status.success?, err
      done = File.join(dir, "done")
      wait_until(60, -> { File.read(File.join(dir, "err")) }) { File.exist?(done) }
      daemon = JSON.parse(File.read(done), symbolize_names: true)
      from_daemon = receiver.all_uploads.select { |u| u.labels["pid"] == daemon[:pid].to_s }
      refute_empty from_daemon, "uploads from the daemon (#{daemon[:pid]}): #{daemon}"
      assert(from_daemon.all? { |u| samples_of(u).positive? })
      assert_equal from_daemon.size, daemon[:stats][:uploaded]
      assert_empty File.read(File.join(dir, "err"))
    end
  ensure
    receiver&.stop
  end

  def test_autorun_pushes_from_the_environment
    receiver = PyroscopeReceiver.new
    env = { "RUBYOPT" => "-rstrobe/autorun", "STROBE_CONTINUOUS_URL" => receiver.url,
            "STROBE_SERVICE_NAME" => "worker", "STROBE_LABELS" => "team=core,tier=2", "STROBE_UPLOAD_EVERY" => "1" }
    code = "def fib(n) = n < 2 ? n : fib(n - 1) + fib(n - 2); t = Time.now; fib(20) while Time.now - t < 1.5"
    _, err, status = run_ruby(code, env: env)
    assert status.success?, err
    assert_match(/profiling continuously to #{Regexp.escape(receiver.url)} as worker/, err)
    uploads = receiver.all_uploads
    refute_empty uploads
    assert(uploads.all? { |u| u.app == "worker.cpu" && u.labels.values_at("team", "tier") == %w[core 2] })
  ensure
    receiver&.stop
  end

  def test_autorun_refuses_a_bad_setting_in_one_line
    env = { "RUBYOPT" => "-rstrobe/autorun", "STROBE_CONTINUOUS_URL" => "ftp://x", "STROBE_SERVICE_NAME" => "w" }
    out, err, status = run_ruby("puts :ran", env: env)
    assert status.success?
    assert_equal "ran\n", out
    assert_match(/\Astrobe: not profiling: url must be an http/, err)
    assert_equal 1, err.lines.size, err
  end

  def test_options_are_checked
    ok = { url: "http://127.0.0.1:1", service_name: "s" }
    error = assert_raises(ArgumentError) { Strobe::Continuous.start(**ok, sample_every: 3) }
    assert_match(/unknown option: :sample_every/, error.message)
    assert_raises(ArgumentError) { Strobe::Continuous.start(url: "http://x") }
    assert_match(/service_name/, assert_raises(ArgumentError) { Strobe::Continuous.start(**ok, service_name: "a b") }.message)
    assert_match(/label name/, assert_raises(ArgumentError) { Strobe::Continuous.start(**ok, labels: { "a-b" => 1 }) }.message)
    assert_match(/Strobe's own/, assert_raises(ArgumentError) { Strobe::Continuous.start(**ok, labels: { pid: 1 }) }.message)
    assert_match(/label syntax/, assert_raises(ArgumentError) { Strobe::Continuous.start(**ok, labels: { a: "x,y" }) }.message)
    assert_match(/mode/, assert_raises(ArgumentError) { Strobe::Continuous.start(**ok, mode: :trace) }.message)
    assert_match(/overhead_target/, assert_raises(ArgumentError) { Strobe::Continuous.start(**ok, overhead_target: 2) }.message)
    assert_match(/not both/, assert_raises(ArgumentError) { Strobe::Continuous.start(**ok, basic_auth: %w[u p], bearer_token: "t") }.message)
    refute Strobe::Continuous.running?
  end

  # The push session and the pull endpoint take the results of what they
  # start, so neither adds to a profile the program stopped and has not yet
  # taken (a start would: rounds merge until results). They say why, and
  # the program's Strobe.results gets its profile whole.
  def test_a_stopped_profile_waiting_for_its_results_is_left_to_its_owner
    assert Strobe.start(mode: :custom)
    Strobe.sample
    assert Strobe.stop
    pull = Strobe::Continuous::PullProfiler.new(mode: :wall, interval: 1000)
    busy = assert_raises(Strobe::Continuous::Busy) { pull.profile(seconds: 1) }
    assert_match(/a stopped profile waits for Strobe\.results/, busy.message)
    busy = assert_raises(Strobe::Continuous::Busy) do
      Strobe::Continuous.start(url: "http://127.0.0.1:9", service_name: "shop", upload_every: 1)
    end
    assert_match(/a stopped one waits for Strobe\.results/, busy.message)
    refute Strobe.running?
    refute Strobe::Continuous.running?
    result = Strobe.results
    assert_equal [:custom, 1], [result[:mode], result[:samples]]
  ensure
    Strobe.stop
    Strobe.results
  end

  def test_auth_and_tenant_headers_are_sent
    receiver = PyroscopeReceiver.new
    run_child(receiver.url, seconds: 1.2, options: ', bearer_token: "s3cret", tenant_id: "team-a"')
    upload = receiver.all_uploads.first
    assert_equal "Bearer s3cret", upload.headers["authorization"]
    assert_equal "team-a", upload.headers["x-scope-orgid"]
    run_child(receiver.url, seconds: 1.2, options: ', basic_auth: ["ann", "pw"]')
    assert_equal "Basic #{['ann:pw'].pack('m0')}", receiver.all_uploads.last.headers["authorization"]
  ensure
    receiver&.stop
  end

  # The governor: the interval that holds the cost near the target.
  def test_the_governor_lengthens_and_shortens_the_interval
    g = Strobe::Continuous::Governor.new(0.01, 10_000, 1_000_000)
    assert_equal 10_000, g.next_interval(10_000, 0.09, 10), "0.9 % of one CPU: within the target"
    assert_equal 40_000, g.next_interval(10_000, 1.0, 10), "10 %: at most four times slower per window"
    assert_equal 25_000, g.next_interval(10_000, 0.2, 10), "2 %: to 0.8 % (the aim)"
    assert_equal 20_000, g.next_interval(40_000, 0.01, 10), "0.1 %: at most twice as fast per window"
    assert_equal 10_000, g.next_interval(15_000, 0.01, 10), "never faster than asked"
    assert_equal 1_000_000, g.next_interval(900_000, 5.0, 10), "never slower than the slowest"
    assert_equal 10_000, Strobe::Continuous::Governor.new(nil, 10_000, 1_000_000).next_interval(10_000, 5.0, 10)
  end

  def test_the_governor_holds_a_low_target
    receiver = PyroscopeReceiver.new
    stats, = run_child(receiver.url, seconds: 4, options: ", overhead_target: 0.0005, interval: 1000")
    assert_operator stats[:interval], :>, 1000, "a target below what 1 kHz costs lengthens the interval: #{stats}"
    rates = receiver.all_uploads.map { |u| u.labels["sample_rate"].to_i }
    assert_equal 1000, rates.first
    assert_operator rates.last, :<, 1000, "the rate in force is each window's label: #{rates}"
    last = receiver.all_uploads.last
    assert_in_delta rates.last, 1e9 / profile(last.profile)[:period], 1, "and its pprof period"
  ensure
    receiver&.stop
  end

  # The pull endpoint of a real program, as Alloy and Parca scrape it:
  # curl, then go tool pprof.
  def test_the_pull_endpoint_serves_a_profile_of_the_seconds_asked
    code = <<~RUBY
      require "strobe/continuous"
      def fib(n) = n < 2 ? n : fib(n - 1) + fib(n - 2)
      server = Strobe::Continuous.listen("127.0.0.1:0", token: "t0ken")
      $stdout.puts server.port
      $stdout.flush
      t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      fib(20) until $stdin.wait_readable(0) || Process.clock_gettime(Process::CLOCK_MONOTONIC) - t > 60
    RUBY
    IO.popen([RbConfig.ruby, "-I#{LIB}", "-rio/wait", "-e", code], "r+") do |child|
      port = Integer(child.gets)
      Dir.mktmpdir do |dir|
        path = File.join(dir, "profile.pb.gz")
        url = "http://127.0.0.1:#{port}/debug/pprof/profile?seconds=2"
        out, err, status = run_tool("curl", "-sS", "-o", path, "-w", "%{http_code} %{content_type}",
                                    "-H", "Authorization: Bearer t0ken", url, timeout: 60)
        assert status.success?, err
        assert_equal "200 application/octet-stream", out
        top, err, status = run_tool("go", "tool", "pprof", "-top", path)
        assert status.success?, "go tool pprof failed: #{err}"
        assert_match(/Object#fib/, top)
        duration = Float(top[/Duration: ([\d.]+)s/, 1])
        assert_in_delta 2.0, duration, 0.5, "samples from those 2 s: #{top}"
        out, = run_tool("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", url, timeout: 30)
        assert_equal "401", out, "the token is required"
      end
    ensure
      child.puts "done"
    end
  end

  def test_autorun_listens_from_the_environment
    env = { "RUBYOPT" => "-rstrobe/autorun", "STROBE_PPROF_LISTEN" => "127.0.0.1:0" }
    _, err, status = run_ruby("sleep 0.1", env: env)
    assert status.success?, err
    assert_match(%r{\Astrobe: serving pprof at http://127\.0\.0\.1:\d+/debug/pprof/profile\?seconds=N$}, err)
    both = env.merge("STROBE_CONTINUOUS_URL" => "http://127.0.0.1:9")
    _, err, = run_ruby("sleep 0.1", env: both)
    assert_match(/not profiling: STROBE_CONTINUOUS_URL and STROBE_PPROF_LISTEN are both set/, err)
  end

  # Issue 30, item 9: every interface without a token is refused in one
  # line that says how to give one (nothing listens); with a token (never
  # shown), or STROBE_PPROF_INSECURE=1, it is served.
  def test_autorun_needs_a_token_to_listen_on_every_interface
    listening = "require 'socket'; print ObjectSpace.each_object(TCPServer).count { |s| !s.closed? }"
    env = { "RUBYOPT" => "-rstrobe/autorun", "STROBE_PPROF_LISTEN" => "0.0.0.0:0" }
    out, err, status = run_ruby(listening, env: env)
    assert status.success?, err
    assert_equal 1, err.lines.size, err
    assert_match(/\Astrobe: not profiling: the pull endpoint at 0\.0\.0\.0:0 would serve profiles to anyone/, err)
    assert_includes err, "STROBE_PPROF_TOKEN"
    assert_includes err, "STROBE_PPROF_INSECURE=1"
    assert_equal "0", out, "nothing listens"

    out, err, status = run_ruby(listening, env: env.merge("STROBE_PPROF_TOKEN" => "s3cret-t0ken"))
    assert status.success?, err
    assert_match(%r{\Astrobe: serving pprof at http://0\.0\.0\.0:\d+/debug/pprof/profile\?seconds=N\n\z}, err)
    refute_includes err, "s3cret"
    assert_equal "1", out

    _, err, = run_ruby(listening, env: env.merge("STROBE_PPROF_INSECURE" => "1"))
    assert_match(/\Astrobe: serving pprof at /, err)
    _, err, = run_ruby(listening, env: env.merge("STROBE_PPROF_INSECURE" => "yes"))
    assert_match(/\Astrobe: not profiling: STROBE_PPROF_INSECURE must be 1 or 0, got "yes"/, err)
  end

  # Issue 30, item 9: a profile asked while another is taken waits its
  # turn (it used to be refused at once), in the order they came; a
  # request that would wait longer than `wait` is refused, and one killed
  # while waiting leaves its place.
  def test_pull_requests_wait_their_turn_in_order
    profiler = Strobe::Continuous::PullProfiler.new(mode: :wall, wait: 60)
    done = Queue.new
    ask = ->(name) { Thread.new { profiler.profile(seconds: 1).tap { done << name } } }
    first = ask.call(:first)
    wait_until(30) { Strobe.running? }
    killed = Thread.new { profiler.profile(seconds: 1) }
    wait_until(30) { profiler.waiting == 1 }
    second = ask.call(:second)
    wait_until(30) { profiler.waiting == 2 }
    killed.kill.join(30)
    assert_equal 1, profiler.waiting, "the killed request left its place"
    third = ask.call(:third)
    wait_until(30) { profiler.waiting == 2 }

    profiles = [first, second, third].map { |thread| thread.join(60)&.value }
    assert_equal %i[first second third], Array.new(3) { done.pop }
    profiles.each { |bytes| assert_equal "\x1f\x8b".b, bytes.to_s.b[0, 2], "gzipped pprof" }
    assert_equal 0, profiler.waiting
  ensure
    [first, second, third, killed].compact.each { |thread| thread.kill.join(30) }
  end

  def test_a_pull_request_that_would_wait_too_long_is_refused
    profiler = Strobe::Continuous::PullProfiler.new(mode: :wall, wait: 0)
    first = Thread.new { profiler.profile(seconds: 2) }
    wait_until(30) { Strobe.running? }
    error = assert_raises(Strobe::Continuous::Busy) { profiler.profile(seconds: 1) }
    assert_match(/a profile is being taken for another request \(one at a time; waited 0 s\)/, error.message)
    assert_equal 0, profiler.waiting
    assert_equal "\x1f\x8b".b, first.join(60)&.value.to_s.b[0, 2]
  ensure
    first&.kill&.join(30)
  end

  # Review of issue 21: what the program does to Strobe's session.
  def test_the_program_stopping_the_profile_ends_the_session_and_its_threads
    receiver = PyroscopeReceiver.new
    work = <<~RUBY
      fib(20) while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t < 1.5
      Strobe.stop
      Strobe.results
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
      sleep 0.05 while Strobe::Continuous.running? && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      sleep 0.05 while Thread.list.any? { |th| th.name.to_s.start_with?("strobe continuous") } &&
                       Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      $stderr.puts "threads left: \#{Thread.list.map(&:name).compact.grep(/strobe/).inspect}"
      $stderr.puts "restart: \#{Strobe::Continuous.start(url: #{receiver.url.inspect}, service_name: "again").class}"
    RUBY
    _, err = run_child(receiver.url, work: work)
    assert_match(/profiling was stopped by someone else: continuous profiling ends/, err)
    assert_match(/threads left: \[\]/, err)
    assert_match(/restart: Strobe::Continuous\b/, err)
  ensure
    receiver&.stop
  end

  def test_a_killed_window_thread_stops_the_sampling_it_started
    receiver = PyroscopeReceiver.new
    work = <<~RUBY
      fib(20) while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t < 1.2
      Thread.list.find { |th| th.name == "strobe continuous" }.kill.join(10)
      $stderr.puts "running: \#{Strobe::Continuous.running?} \#{Strobe.running?}"
    RUBY
    _, err = run_child(receiver.url, work: work)
    assert_match(/running: false false/, err)
  ensure
    receiver&.stop
  end

  def test_stats_and_stop_work_in_a_trap_handler
    receiver = PyroscopeReceiver.new
    work = <<~RUBY
      done = Queue.new
      trap("USR1") { $stderr.puts "in trap: \#{Strobe::Continuous.stats[:windows]} \#{Strobe::Continuous.stop.class}"; done << 1 }
      fib(20) while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t < 1.2
      Process.kill(:USR1, Process.pid)
      done.pop
    RUBY
    _, err = run_child(receiver.url, work: work)
    assert_match(/in trap: \d+ Hash/, err)
    refute_match(/ThreadError/, err)
  ensure
    receiver&.stop
  end

  # A signal can turn continuous profiling on: start from a trap handler
  # (where Ruby takes no lock: it raised ThreadError) starts the session
  # on a thread of its own and returns it; a second start says false.
  def test_start_works_in_a_trap_handler
    receiver = PyroscopeReceiver.new
    code = <<~RUBY
      require "strobe/continuous"
      require "json"
      def fib(n) = n < 2 ? n : fib(n - 1) + fib(n - 2)
      done = Queue.new
      trap("USR1") do
        2.times do
          $stderr.puts "in trap: \#{Strobe::Continuous.start(url: #{receiver.url.inspect}, service_name: "sig", upload_every: 1).class}"
        end
      rescue StandardError => e
        $stderr.puts "in trap: \#{e.class}: \#{e.message}"
      ensure
        done << 1
      end
      Process.kill(:USR1, Process.pid)
      done.pop
      t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      fib(20) while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t < 1.5
      $stdout.puts JSON.generate(Strobe::Continuous.stop)
    RUBY
    out, err, status = run_ruby(code, timeout: 90)
    assert status.success?, err
    assert_equal "in trap: Strobe::Continuous\nin trap: FalseClass\n", err
    stats = JSON.parse(out.lines.last, symbolize_names: true)
    assert_operator stats[:uploaded], :>=, 1, stats.inspect
    assert_equal stats[:uploaded], receiver.all_uploads.size
  ensure
    receiver&.stop
  end

  # Issue 30: a TERM whose trap asks stats and stop, landing at each point
  # of start, of stop and of a window cut. A TracePoint holds the thread at
  # the point until the trap has begun (on the main thread the trap runs
  # inside the hold), so the signal lands there every run. Point: [event,
  # class, method, what the program does, what the trap(s) return, whether
  # a session runs afterwards]. Each in a child of its own, bounded: a trap
  # that waits on what the code it interrupted holds never returns.
  TRAP_POINTS = {
    "start, before its lock" =>
      [:return, "Strobe::Continuous::Config", :initialize, :start, [%w[NilClass NilClass]], true],
    "start, the profile not started yet" =>
      [:call, "Strobe.singleton_class", :start_own, :start, [%w[NilClass NilClass]], false],
    "start, the profile started, no thread yet" =>
      [:return, "Strobe.singleton_class", :start_own, :start, [%w[NilClass NilClass]], false],
    "start, the upload thread starting" =>
      [:call, "Strobe::Continuous::Uploader", :initialize, :start, [%w[NilClass NilClass]], false],
    "start, the session started, not yet recorded" =>
      [:return, "Strobe::Continuous", :start, :start, [%w[NilClass NilClass]], false],
    "a window cut" =>
      [:call, "Strobe.singleton_class", :snapshot, :run, [%w[Hash Hash]], false],
    "stop, on the thread that stops" =>
      [:call, "Strobe::Continuous", :stop, :stop, [%w[NilClass Hash]], false],
    "stop from a trap, a second signal then" =>
      [:call, "Strobe::Continuous", :stop, :signal, [%w[Hash Hash], %w[NilClass NilClass]], false],
    # The trap raises after stop (as `exit` does): start ends half way.
    "start, the profile started, a trap that raises" =>
      [:return, "Strobe.singleton_class", :start_own, :raise, [%w[NilClass NilClass]], false]
  }.freeze

  def trap_program(url, point)
    event, owner, method, program, traps, runs = TRAP_POINTS.fetch(point)
    <<~RUBY
      require "strobe/continuous"
      require "json"
      def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      def wait_for(seconds)
        deadline = now + seconds
        sleep 0.01 until yield || now > deadline
      end
      entered = 0
      in_trap = []
      trap("TERM") do
        entered += 1
        in_trap << [Strobe::Continuous.stats.class.name, Strobe::Continuous.stop.class.name]
        raise Interrupt if #{program == :raise}
      rescue StandardError => e
        in_trap << "\#{e.class}: \#{e.message}"
      end
      hit = false
      point = TracePoint.new(#{event.inspect}) do |tp|
        next if hit || tp.defined_class != #{owner} || tp.method_id != #{method.inspect}

        hit = true
        want = entered + 1
        Process.kill(:TERM, Process.pid)
        wait_for(10) { entered >= want } unless #{program == :signal}
      end
      point.enable
      started = begin
        Strobe::Continuous.start(url: #{url.inspect}, service_name: "boot", upload_every: 1)
      rescue Interrupt => e
        e
      end
      Process.kill(:TERM, Process.pid) if #{program == :signal}
      Strobe::Continuous.stop if #{program == :stop}
      wait_for(20) { in_trap.size >= #{traps.size} }
      wait_for(20) do
        !Strobe::Continuous.running? && !Strobe.running? &&
          Thread.list.none? { |th| th.name.to_s.start_with?("strobe continuous") }
      end unless #{runs}
      point.disable
      $stdout.puts JSON.generate(hit: hit, traps: in_trap, started: started.class.name,
                                 running: Strobe::Continuous.running?, profiling: Strobe.running?,
                                 threads: Thread.list.map(&:name).grep(/strobe continuous/).sort)
      Strobe::Continuous.stop
    RUBY
  end

  def test_stop_and_stats_from_a_trap_at_every_point_of_start_stop_and_a_cut
    receiver = PyroscopeReceiver.new
    problems = TRAP_POINTS.filter_map do |point, (*, traps, runs)|
      out, err, status = run_ruby(trap_program(receiver.url, point), timeout: 40)
      next "#{point}: the child failed: #{err[0, 300]}" unless status.success?

      state = JSON.parse(out.lines.last, symbolize_names: true)
      expected = { hit: true, traps: traps, started: point.include?("raises") ? "Interrupt" : "Strobe::Continuous",
                   running: runs, profiling: runs,
                   threads: runs ? ["strobe continuous", "strobe continuous upload"] : [] }
      next "#{point}: #{state} (expected #{expected})" unless state == expected && !err.match?(/ThreadError/)
    rescue Minitest::Assertion => e # (the child killed at its timeout)
      "#{point}: the trap never returned: #{e.message[/did not finish within \d+s/]}"
    end
    assert problems.empty?, problems.join("\n")
  ensure
    receiver&.stop
  end

  # Lines about failures are written outside every lock: a stderr nobody
  # reads stalls the upload thread only, never stats or stop.
  def test_a_stderr_nobody_reads_never_holds_stop
    receiver = PyroscopeReceiver.new(:error)
    work = <<~RUBY
      fib(20) while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t < 2.5
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      Strobe::Continuous.stats
      Strobe::Continuous.stop
      $stdout.puts "stopped in \#{(Process.clock_gettime(Process::CLOCK_MONOTONIC) - started).round(1)}"
      $stdout.flush
      exit!(0)
    RUBY
    code = <<~RUBY
      require "strobe/continuous"
      def fib(n) = n < 2 ? n : fib(n - 1) + fib(n - 2)
      reader, writer = IO.pipe
      writer.write_nonblock("x" * 65_536, exception: false) until writer.write_nonblock("x", exception: false) == :wait_writable
      Strobe::Continuous.start(url: #{receiver.url.inspect}, service_name: "shop", upload_every: 1, flush_timeout: 1,
                               err: writer)
      t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      #{work}
    RUBY
    out, err, status = run_ruby(code, timeout: 60)
    assert status.success?, err
    seconds = Float(out[/stopped in ([\d.]+)/, 1])
    assert_operator seconds, :<, 10, "stop is bounded by flush_timeout, not by stderr"
  ensure
    receiver&.stop
  end

  def test_a_long_thread_name_is_cut_in_the_labels
    receiver = PyroscopeReceiver.new
    work = <<~RUBY
      Thread.current.name = "w" * 3000
      fib(20) while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t < 1.2
    RUBY
    run_child(receiver.url, work: work)
    names = receiver.all_uploads.flat_map { |u| profile(u.profile)[:samples].map { |x| x[:labels].to_h["thread"] } }
    refute_empty names
    assert_equal ["w" * 1024], names.uniq
  ensure
    receiver&.stop
  end
end
