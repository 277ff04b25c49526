# frozen_string_literal: true

require "test_helper"
require "firefox_checks"
require "net/http"
require "strobe/serve"
require "socket"
require "stringio"
require "json"
require "zlib"
require "tmpdir"

# `strobe serve -- COMMAND`: the profiled program serves its profile so far
# as Firefox Profiler JSON and in Strobe's own format (for `strobe report
# URL`) on 127.0.0.1, under a secret path, readable cross-origin by the
# Firefox Profiler only, to many clients at once, and keeps serving it after
# it ends, until interrupted.
#
# Every wait here is bounded (a safeguard against a hang); no assertion is
# about how long something took.
class TestServe < Minitest::Test
  include FirefoxChecks

  STROBE = File.join(StrobeTestHelpers::ROOT, "exe/strobe")
  AUTORUN = File.join(StrobeTestHelpers::LIB, "strobe/autorun.rb")
  URL = %r{at (http://127\.0\.0\.1:\d+/[0-9a-f]{32}/profile\.json)}
  PROFILER = "https://profiler.firefox.com"

  # A program that computes on two threads until the file `stop` appears,
  # and starts another Ruby process on the way (which cannot bind the port).
  APP = <<~RUBY
    def busy = 20_000.times.sum
    ticker = Thread.new { loop { busy; sleep 0.002 } }
    ticker.name = "ticker"
    system(RbConfig.ruby, "-e", "puts :child_ran")
    busy until File.exist?(ARGV[0])
  RUBY

  # The same without the child process.
  BUSY = <<~RUBY
    def busy = 20_000.times.sum
    Thread.new { loop { busy; sleep 0.002 } }
    busy until File.exist?(ARGV[0])
  RUBY

  # ---- strobe serve as a command -------------------------------------------

  # A `strobe serve` process running app_code (given the path of the file
  # `stop` as ARGV[0]), once it has announced its URL.
  Launched = Struct.new(:wait, :url, :stderr, :reader, :stdout) do
    def pid = wait.pid
    def err = stderr.dup

    # Waits for the process to end: [stdout, stderr, status].
    def finish(timeout = 60)
      status = Timeout.timeout(timeout) { wait.value }
      reader.join(timeout)
      [stdout.value, err, status]
    end
  end

  def launch(dir, app_code: APP, args: [])
    app = File.join(dir, "app.rb")
    File.write(app, app_code)
    env = {} # as this process: under rake test:asan, the sanitizer build
    stdin, stdout, stderr, wait = Open3.popen3(env, RbConfig.ruby, "-I#{StrobeTestHelpers::LIB}", STROBE, "serve",
                                               "--port", "0", *args, "--", RbConfig.ruby, app, File.join(dir, "stop"),
                                               pgroup: true)
    @launched << wait
    stdin.close
    err = +""
    reader = Thread.new { stderr.each_line { |line| err << line } }
    out = Thread.new { stdout.read }
    # Both lines of the announcement (two writes: the reader may have the
    # first only).
    url = nil
    wait_until(60, -> { err }) { (url = err[URL, 1]) && err.include?("strobe: open ") }
    Launched.new(wait, url, err, reader, out)
  end

  # Runs `strobe serve` on app_code; yields the profile's URL and a lambda
  # returning stderr so far, then ends the program (the file `stop`) and
  # sends it `signal` once it says its profile is still served. Returns
  # [stdout, stderr, status].
  def serve(dir, args: [], app_code: APP, signal: :INT)
    run = launch(dir, app_code: app_code, args: args)
    yield run.url, -> { run.err }
    File.write(File.join(dir, "stop"), "")
    wait_until(60, -> { run.err }) { run.err.include?("its profile is still served") }
    Process.kill(signal, run.pid)
    run.finish
  end

  def setup
    @launched = []
  end

  def teardown
    @launched.each { |wait| Process.kill(:KILL, -wait.pid) if wait.alive? }
  end

  def get(url, headers = {})
    uri = URI(url)
    Net::HTTP.start(uri.host, uri.port, open_timeout: 10, read_timeout: 60) do |http|
      http.request(Net::HTTP::Get.new(uri, headers))
    end
  end

  # A request of any verb to path on port, with headers as given (Host
  # included).
  def request(port, path, headers = {}, verb = Net::HTTP::Get)
    Net::HTTP.start("127.0.0.1", port, open_timeout: 10, read_timeout: 60) do |http|
      http.request(verb.new(path, headers))
    end
  end

  def profile_of(response)
    body = response["content-encoding"] == "gzip" ? gunzip(response.body) : response.body
    JSON.parse(body)
  end

  def sample_count(doc)
    doc["threads"].sum { |t| t["samples"]["length"] }
  end

  def test_serves_the_profile_so_far_then_after_the_program_ends
    Dir.mktmpdir do |dir|
      out, err, status = serve(dir) do |url, stderr|
        assert_includes stderr.call, "strobe: open #{PROFILER}/from-url/#{URI.encode_www_form_component(url)}"

        # until the ticker thread has run (it registers as it starts)
        first = nil
        wait_until(30, stderr) do
          response = get(url, "Origin" => PROFILER)
          first = response if response.code == "200" && profile_of(response)["threads"].any? { |t| t["name"] == "ticker" }
        end
        assert_equal PROFILER, first["access-control-allow-origin"]
        assert_equal "application/json", first["content-type"]
        doc = profile_of(first)
        assert_firefox_invariants(doc)
        names = doc["threads"].map { |t| t["name"] }
        assert_includes names, "main"
        assert_includes names, "ticker"
        refute(names.any? { |name| name.to_s.start_with?("strobe serve") }, "the server's own threads are not profiled")

        # each GET returns everything so far (a snapshot is reused for a
        # second at least), gzipped when asked
        second = nil
        wait_until(30, stderr) do
          second = get(url, "Accept-Encoding" => "gzip")
          sample_count(profile_of(second)) > sample_count(doc)
        end
        assert_equal "gzip", second["content-encoding"]

        assert_equal "404", get(url.sub("profile.json", "nope")).code
        assert_match(/from-url/, get(url.sub("profile.json", "")).body)
        uri = URI(url)
        post = Net::HTTP.start(uri.host, uri.port) { |http| http.request(Net::HTTP::Post.new(uri)) }
        assert_equal "405", post.code

        File.write(File.join(dir, "stop"), "")
        wait_until(60, stderr) { stderr.call.include?("its profile is still served") }
        final = profile_of(get(url))
        assert_firefox_invariants(final)
        assert_operator sample_count(final), :>=, sample_count(profile_of(second))
      end
      assert status.success?, "exit status #{status.inspect}: #{err}"
      assert_equal "child_ran\n", out
      # the child Ruby process could not bind the port: one line, and it ran
      assert_equal 1, err.scan(/not profiling this process: cannot serve on 127\.0\.0\.1/).size, err
    end
  end

  # `strobe report URL` reads the profile so far from strobe.json, as it
  # reads a file: the report of a program still running, of one thread.
  def test_strobe_report_reads_the_served_profile
    Dir.mktmpdir do |dir|
      _, err, status = serve(dir) do |url, stderr|
        strobe_url = url.sub(/profile\.json\z/, "strobe.json")
        assert_includes stderr.call, "strobe: in Strobe's format at #{strobe_url} (strobe report reads it)\n"
        wait_until(30, stderr) do # until the ticker thread has run
          Strobe::ProfileFile.parse(get(strobe_url).body, "served")[:threads].any? do |_, t|
            t[:name] == "ticker" && t[:samples].positive?
          end
        end
        report = lambda do |*args|
          out, report_err, report_status = run_command({}, RbConfig.ruby, "-I#{StrobeTestHelpers::LIB}", STROBE, "report",
                                                        strobe_url, *args)
          assert report_status.success?, "strobe report #{args.join(' ')}: #{report_err}"
          assert_equal "", report_err
          out
        end
        whole = report.call
        assert_match(/^  Mode: wall\(1000\)$/, whole)
        assert_match(/^ +\d+ +\d+ +\([\d.]+%\)( .*)? +ticker$/, whole, "the threads are listed")
        assert_match(/^  Thread: \d+ \(ticker\)$/, report.call("--thread", "ticker"))
      end
      assert status.success?, err
    end
  end

  # ---- the server in this process ------------------------------------------

  # A Serve on a free port, with this process profiled; yields it and its
  # log (a StringIO).
  def with_server(**options)
    log = StringIO.new
    server = Strobe::Serve.new(0, err: log, **options).start
    started = Strobe.start(mode: :wall, raw: true)
    assert started, "the profiler was running already"
    yield server, log
  ensure
    if started
      Strobe.stop
      Strobe.results
    end
    server&.stop
  end

  def profile_path(server)
    URI(server.url).path
  end

  def host(server)
    "127.0.0.1:#{server.port}"
  end

  # Only a request for this listener, with the token, is answered; the
  # profile is readable cross-origin by the Firefox Profiler only.
  def test_only_the_printed_link_reads_the_profile_and_only_the_profiler_cross_origin
    with_server do |server, _|
      assert_match %r{\A[0-9a-f]{32}\z}, server.token
      assert_equal "http://127.0.0.1:#{server.port}/#{server.token}/profile.json", server.url
      assert_equal "#{PROFILER}/from-url/#{URI.encode_www_form_component(server.url)}", server.profiler_url
      path = profile_path(server)
      port = server.port

      # DNS rebinding: another name for 127.0.0.1 is refused, token or not
      ["attacker.example", "attacker.example:#{port}", "127.0.0.1", "127.0.0.1:#{port + 1}", "[::1]:#{port}", ""]
        .each do |name|
          response = request(port, path, "Host" => name)
          assert_equal "403", response.code, "Host: #{name}"
          refute_includes response.body, "{", "Host: #{name}"
        end
      assert_equal "200", request(port, path, "Host" => "localhost:#{port}").code
      assert_equal "200", request(port, path, "Host" => "LocalHost:#{port}").code
      assert_equal "200", request(port, path, "Host" => host(server)).code

      # without the token, or with a wrong one, nothing
      token = server.token
      wrong = token[0..-2] + (token[-1] == "0" ? "1" : "0")
      ["/profile.json", "/", "/#{wrong}/profile.json", "/#{token[0..-2]}/profile.json", "/#{token}0/profile.json",
       "/#{token.upcase}/profile.json", "/x/#{token}/profile.json"].each do |other|
        response = request(port, other, "Host" => host(server))
        assert_equal "404", response.code, other
        refute_includes response.body, token, other
      end
      index = request(port, "/#{token}/", "Host" => host(server))
      assert_equal "200", index.code
      assert_includes index.body, server.profiler_url
      assert_equal "200", request(port, "/#{token}", "Host" => host(server)).code

      # cross-origin reads: the Firefox Profiler only, named, never *
      from_profiler = request(port, path, "Host" => host(server), "Origin" => PROFILER)
      assert_equal PROFILER, from_profiler["access-control-allow-origin"]
      assert_includes from_profiler["vary"], "Origin"
      ["http://localhost:8000", "null", "http://127.0.0.1:#{port}", "https://profiler.firefox.com.attacker.example",
       "http://profiler.firefox.com"].each do |origin|
        response = request(port, path, "Host" => host(server), "Origin" => origin)
        assert_nil response["access-control-allow-origin"], origin
        assert_includes response["vary"], "Origin"
      end
      assert_nil request(port, path, "Host" => host(server))["access-control-allow-origin"]

      # the preflight a browser may send (Chrome's private network access)
      preflight = request(port, path, { "Host" => host(server), "Origin" => PROFILER,
                                        "Access-Control-Request-Method" => "GET",
                                        "Access-Control-Request-Private-Network" => "true" },
                          Net::HTTP::Options)
      assert_equal "204", preflight.code
      assert_equal PROFILER, preflight["access-control-allow-origin"]
      assert_equal "true", preflight["access-control-allow-private-network"]
    end
  end

  # strobe.json is the profile so far in Strobe's own file format: under
  # the same token and Host checks, gzipped when asked, shared by requests
  # close together, and not readable cross-origin (the Firefox Profiler
  # reads profile.json).
  def test_strobe_json_is_the_profile_in_strobes_format
    with_server(fresh: 600) do |server, _|
      assert_equal "http://127.0.0.1:#{server.port}/#{server.token}/strobe.json", server.strobe_url
      path = URI(server.strobe_url).path
      wait_until(30) { spin(0.01) || Strobe.snapshot[:samples].positive? } # samples to serve
      plain = request(server.port, path, "Host" => host(server), "Origin" => PROFILER, "Accept-Encoding" => "identity")
      assert_equal ["200", "application/json"], [plain.code, plain["content-type"]]
      assert_nil plain["access-control-allow-origin"]
      result = Strobe::ProfileFile.parse(plain.body, "served")
      assert_equal [:wall, 1000, Process.pid], result.values_at(:mode, :interval, :pid)
      assert_kind_of Array, result[:raw], "a complete profile: raw samples too"
      gzipped = request(server.port, path, "Host" => host(server), "Accept-Encoding" => "gzip")
      assert_equal "gzip", gzipped["content-encoding"]
      assert_equal plain.body, gunzip(gzipped.body), "the same snapshot"
      assert_equal 1, server.snapshots.builds
      assert_equal "200", get(server.url).code
      assert_equal 2, server.snapshots.builds, "the Firefox export is built once too"

      assert_equal "403", request(server.port, path, "Host" => "attacker.example").code
      assert_equal "404", request(server.port, path.sub(server.token, "0" * 32), "Host" => host(server)).code
      assert_includes request(server.port, "/#{server.token}/", "Host" => host(server)).body, server.strobe_url
    end
  end

  # Requests a proxy and this server could read differently are refused:
  # two Host fields (the last one won), a field folded onto the one before.
  def test_ambiguous_headers_are_refused
    with_server do |server, _|
      path = "/#{server.token}/"
      raw = lambda do |head|
        TCPSocket.open("127.0.0.1", server.port) do |socket|
          socket.write("GET #{path} HTTP/1.1\r\n#{head}\r\n")
          socket.read[/\AHTTP\/1\.1 (\d+)/, 1]
        end
      end
      assert_equal "200", raw.call("Host: #{host(server)}\r\n")
      assert_equal "400", raw.call("Host: attacker.example\r\nHost: #{host(server)}\r\n")
      assert_equal "400", raw.call("Host: #{host(server)}\r\n Host: attacker.example\r\n")
      assert_equal "400", raw.call("Host: #{host(server)}\r\nX Bad: 1\r\n")
    end
  end

  def test_tokens_differ_and_compare_in_full
    tokens = Array.new(2) do
      server = Strobe::Serve.new(0, err: StringIO.new)
      server.token
    ensure
      server&.stop
    end
    refute_equal tokens[0], tokens[1]
    assert Strobe::Serve.secure_equal?("abc", "abc")
    refute Strobe::Serve.secure_equal?("abd", "abc")
    refute Strobe::Serve.secure_equal?("ab", "abc")
    refute Strobe::Serve.secure_equal?("", "abc")
  end

  # Idle connections, and clients sending their request a byte at a time,
  # more of them than there are handler threads: a GET is answered while
  # they are all still open (a server reading connections one after another
  # would answer it only after dropping each of them at its deadline).
  def test_idle_and_slow_connections_keep_nobody_waiting
    with_server(request_timeout: 600) do |server, _|
      idle = Array.new(Strobe::Serve::HANDLERS + 4) { TCPSocket.new("127.0.0.1", server.port) }
      slow = Array.new(3) { TCPSocket.new("127.0.0.1", server.port) }
      request_text = "GET #{profile_path(server)} HTTP/1.1\r\nHost: #{host(server)}\r\n\r\n"
      slow.each { |s| s.write(request_text[0, 5]) }
      stalled = TCPSocket.new("127.0.0.1", server.port)
      stalled.write(request_text) # and never reads
      drip = Thread.new do
        request_text[5, 10].each_char do |char|
          slow.each { |s| s.write(char) }
          sleep 0.05
        end
      end

      response = get(server.url)
      assert_equal "200", response.code
      assert_firefox_invariants(profile_of(response))
      drip.join(60)
      (idle + slow).each do |socket|
        assert_equal :wait_readable, socket.read_nonblock(1, exception: false), "closed or answered early"
      end
      (idle + slow + [stalled]).each(&:close)
    end
  end

  # Connections beyond the bound push out the oldest still sending its
  # head (503 at once, closed), never queued; the new one is read.
  def test_connections_beyond_the_bound_push_out_the_oldest
    with_server(request_timeout: 600) do |server, _|
      # (accepted in the order they connect)
      held = Array.new(Strobe::Serve::MAX_PENDING + 1) { TCPSocket.new("127.0.0.1", server.port) }
      refused = Timeout.timeout(60) { held.first.read }
      assert_match %r{\AHTTP/1\.1 503 }, refused
      assert_includes refused, "too many connections"
      held.drop(1).each do |socket|
        assert_equal :wait_readable, socket.read_nonblock(1, exception: false), "closed or answered early"
      end
      answered = get(server.url)
      assert_equal "200", answered.code
      assert_firefox_invariants(profile_of(answered))
    ensure
      held&.each(&:close)
    end
  end

  # Issue 30, item 10: slow connections from 8 loopback addresses, more
  # than MAX_PENDING of them, all open: the printed link is still answered
  # (they used to take every place: 503).
  def test_slow_connections_from_many_addresses_keep_no_request_out
    with_server(request_timeout: 600) do |server, _|
      slow = (2..9).flat_map do |host|
        Array.new(Strobe::Serve::MAX_PENDING / 8 + 1) do
          TCPSocket.new("127.0.0.1", server.port, "127.0.0.#{host}", 0).tap { |s| s.write("GET / HTT") }
        end
      end
      assert_operator slow.size, :>, Strobe::Serve::MAX_PENDING
      response = get(server.url)
      assert_equal "200", response.code, response.body
      assert_firefox_invariants(profile_of(response))
    ensure
      slow&.each(&:close)
    end
  end

  # Requests close together share one snapshot, built once (the others wait
  # for it), gzipped once.
  def test_requests_close_together_share_one_snapshot
    with_server(fresh: 600) do |server, _|
      responses = Array.new(6) do |i|
        Thread.new { get(server.url, i.even? ? {} : { "Accept-Encoding" => "gzip" }) }
      end.map(&:value)
      assert(responses.all? { |r| r.code == "200" }, responses.map(&:code).inspect)
      plain = responses.each_slice(2).map(&:first).map(&:body)
      assert_equal 1, plain.uniq.size
      assert(responses.each_slice(2).map(&:last).all? { |r| r["content-encoding"] == "gzip" })
      assert_equal 1, server.snapshots.builds
      assert_firefox_invariants(JSON.parse(plain.first))
    end
  end

  # The deadlines: a reader that never reads makes the writer give up; a
  # request dripped a byte at a time is dropped at the request deadline,
  # not read for as long as it keeps dripping.
  def test_deadlines
    reader, writer = UNIXSocket.pair
    out = Strobe::Serve::DeadlineWriter.new(writer, Process.clock_gettime(Process::CLOCK_MONOTONIC) + 0.5)
    assert_raises(Strobe::Serve::Timeout) { out.write("x" * (64 << 20)) }
    [reader, writer].each(&:close)

    with_server(request_timeout: 0.5) do |server, _|
      dripper = TCPSocket.new("127.0.0.1", server.port)
      dropped = Timeout.timeout(60) do
        loop do
          dripper.write("G")
          break :dropped if dripper.wait_readable(0.1) && dripper.read_nonblock(1, exception: false).nil?
        end
      rescue Errno::EPIPE, Errno::ECONNRESET
        :dropped
      end
      assert_equal :dropped, dropped
      dripper.close
    end
  end

  def test_bad_settings
    assert_raises(ArgumentError) { Strobe::Serve.new(0, fresh: 0) }
    error = assert_raises(ArgumentError) { Strobe::Serve.new(0, request_timeout: "5") }
    assert_match(/request_timeout/, error.message)
    error = assert_raises(ArgumentError) { Strobe::Serve.new(0, timeout: 5) }
    assert_match(/timeout/, error.message)
    assert_raises(ArgumentError) { Strobe::Native.close_in_children(-2) }
  end

  # ---- the server thread survives ------------------------------------------

  # accept(2) failing for want of descriptors (EMFILE) is retried: the
  # connection is answered once the program has descriptors again, and the
  # program ends normally.
  def test_accept_errors_are_retried
    app = <<~RUBY
      Process.setrlimit(:NOFILE, 64)
      files = []
      begin
        loop { files << File.open(File::NULL) }
      rescue Errno::EMFILE
      end
      files.pop.close
      File.write(ARGV[0] + ".full", "") # every descriptor taken again below
      files << File.open(File::NULL)
      sleep 0.02 until File.exist?(ARGV[0] + ".free")
      files.each(&:close)
      sleep 0.02 until File.exist?(ARGV[0])
    RUBY
    Dir.mktmpdir do |dir|
      _, err, status = serve(dir, app_code: app) do |url, stderr|
        wait_until(60, stderr) { File.exist?(File.join(dir, "stop.full")) }
        response = Thread.new { get(url) }
        wait_until(60, stderr) { stderr.call.include?("strobe serve: cannot accept a connection (") }
        File.write(File.join(dir, "stop.free"), "")
        assert_equal "200", response.value.code
        assert_firefox_invariants(profile_of(response.value))
      end
      assert status.success?, "#{status.inspect}: #{err}"
      refute_match(/Deadlock|fatal/, err)
    end
  end

  # Server threads that were killed are started again by revive.
  def test_killed_server_threads_are_started_again
    with_server do |server, _|
      assert server.serving?
      Thread.list.select { |t| t.name.to_s.start_with?("strobe serve") }.each(&:kill).each(&:join)
      refute server.serving?
      assert server.revive
      assert server.serving?
      assert_equal "200", get(server.url).code
      server.stop
      refute server.serving?
      refute server.revive, "a stopped server stays stopped"
    end
  end

  # Handlers the program kills while it runs are started again by the
  # accept thread: requests go on being answered.
  def test_killed_handlers_are_started_again_while_serving
    with_server do |server, _|
      Thread.list.select { |t| t.name.to_s.match?(/\Astrobe serve \d/) }.each(&:kill).each(&:join)
      assert_equal "200", get(server.url).code
      assert server.serving?
    end
  end

  # A client that takes nothing of its response is dropped after
  # DeadlineWriter::STALL seconds without progress, however far the
  # response deadline is.
  def test_a_client_that_never_reads_is_dropped
    reader, writer = UNIXSocket.pair
    out = Strobe::Serve::DeadlineWriter.new(writer, Strobe::Serve.now + 600)
    error = Timeout.timeout(60) do # a guard against the hang it was, not a timing check
      assert_raises(Strobe::Serve::Timeout) { out.write("x" * (16 << 20)) }
    end
    assert_match(/did not take its response/, error.message)
  ensure
    reader&.close
    writer&.close
  end

  # A program that kills every other thread (at shutdown, say) kills the
  # server's too: they are started again, the profile is served, and the
  # program ends normally.
  def test_a_program_that_kills_our_threads_is_still_served
    app = <<~RUBY
      def busy = 20_000.times.sum
      Thread.new { loop { busy; sleep 0.002 } }
      busy until File.exist?(ARGV[0])
      Thread.list.each { |t| t.kill unless t == Thread.main }
      sleep 0.05 until Thread.list.size == 1
    RUBY
    Dir.mktmpdir do |dir|
      _, err, status = serve(dir, app_code: app) do |url, stderr|
        File.write(File.join(dir, "stop"), "")
        wait_until(60, stderr) { stderr.call.include?("its profile is still served") }
        response = get(url)
        assert_equal "200", response.code
        assert_firefox_invariants(profile_of(response))
      end
      assert status.success?, "#{status.inspect}: #{err}"
      refute_match(/Deadlock|fatal/, err)
    end
  end

  # ---- forked children keep their files ------------------------------------

  # The listening socket's number, closed, may go to a file of the
  # program's: a child forked afterwards must keep that file.
  # What a child forked now reads from file.
  def read_in_a_child(file)
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      writer.write(file.read)
      writer.close
      exit!(0)
    end
    writer.close
    read = Timeout.timeout(60) { reader.read }
    Process.wait(pid)
    reader.close
    read
  end

  def test_a_child_forked_after_the_server_stopped_keeps_its_files
    Dir.mktmpdir do |dir|
      path = File.join(dir, "mine.txt")
      File.write(path, "mine")
      server = Strobe::Serve.new(0, err: StringIO.new)
      fd = server.instance_variable_get(:@server).fileno
      server.stop
      File.open(path) do |file|
        skip "the socket's descriptor #{fd} went elsewhere (file got #{file.fileno})" unless file.fileno == fd
        assert_equal "mine", read_in_a_child(file)
      end
    end
  end

  # A program that closes every descriptor it did not open (as daemons do)
  # closes the listening socket under the server: a file it opens next may
  # get that number, and a child forked then keeps that file.
  def test_a_child_keeps_a_file_under_the_closed_sockets_number
    Dir.mktmpdir do |dir|
      path = File.join(dir, "mine.txt")
      File.write(path, "mine")
      server = Strobe::Serve.new(0, err: StringIO.new)
      socket = server.instance_variable_get(:@server)
      socket.autoclose = false # its descriptor is another file's below
      fd = socket.fileno
      IO.for_fd(fd, autoclose: true).close # behind the server's back
      File.open(path) do |file|
        skip "the socket's descriptor #{fd} went elsewhere (file got #{file.fileno})" unless file.fileno == fd
        assert_equal "mine", read_in_a_child(file)
      end
    ensure
      Strobe::Native.close_in_children(nil)
    end
  end

  # A serve setup that fails (a mode Strobe.start refuses) leaves a child
  # forked afterwards its files, and the program runs unprofiled.
  def test_a_failed_setup_leaves_forked_children_their_files
    app = <<~RUBY
      path = ARGV[0]
      File.open(path) do |file|
        pid = fork { $stdout.syswrite(file.read); exit!(0) }
        Process.wait(pid)
      end
    RUBY
    Dir.mktmpdir do |dir|
      path = File.join(dir, "mine.txt")
      File.write(path, "mine")
      %w[bogus trace].each do |mode|
        env = { "RUBYOPT" => "-r#{AUTORUN}", "STROBE_SERVE" => "0", "STROBE_MODE" => mode }
        out, err, status = run_command(env, RbConfig.ruby, "-I#{StrobeTestHelpers::LIB}", "-e", app, path)
        assert status.success?, "#{mode}: #{err}"
        assert_equal "mine", out, mode
        assert_equal 1, err.lines.size, err
        assert_match(/\Astrobe: not profiling: .*#{mode}/, err)
      end
    end
  end

  # ---- ending ----------------------------------------------------------------

  # One TERM to the running program ends it and the serving (a process
  # manager sends no second one); one TERM while the profile is served after
  # the program ended ends that, with the program's own status.
  def test_one_term_ends_the_program_and_the_server
    Dir.mktmpdir do |dir|
      run = launch(dir, app_code: BUSY)
      Process.kill(:TERM, run.pid)
      _, err, status = run.finish
      assert_equal Signal.list["TERM"], status.termsig, "#{status.inspect}: #{err}"
      assert_includes err, "strobe: the program was ended by SIGTERM; its profile is no longer served"
    end

    Dir.mktmpdir do |dir|
      _, err, status = serve(dir, app_code: BUSY, signal: :TERM) { |url, _| assert_equal "200", get(url).code }
      assert status.success?, "#{status.inspect}: #{err}"
    end
  end

  # Ctrl-C while the program runs ends it and says so; the profile stays
  # served until the next one.
  def test_ctrl_c_ends_the_program_and_the_profile_stays_served
    Dir.mktmpdir do |dir|
      run = launch(dir, app_code: BUSY)
      Process.kill(:INT, run.pid)
      wait_until(60, -> { run.err }) { run.err.include?("its profile is still served") }
      assert_includes run.err, "strobe: the program was interrupted; its profile is still served at #{run.url}"
      assert_equal "200", get(run.url).code
      Process.kill(:INT, run.pid)
      _, err, status = run.finish
      refute status.success?, "interrupted: #{status.inspect}"
      refute_includes err, "Interrupt:"
    end
  end

  # After the program ends, what it wrote comes out, and how it ended is said.
  def test_a_failing_program_is_reported_as_such
    app = <<~RUBY
      $stdout.sync = false
      print "output of the program"
      sleep 0.05 until File.exist?(ARGV[0])
      raise "boom in app"
    RUBY
    Dir.mktmpdir do |dir|
      out, err, status = serve(dir, app_code: app) do |_, stderr|
        File.write(File.join(dir, "stop"), "")
        wait_until(60, stderr) { stderr.call.include?("still served") }
        assert_includes stderr.call, "strobe: the program ended with RuntimeError: boom in app"
      end
      assert_equal "output of the program", out
      assert_equal 1, status.exitstatus
      assert_includes err, "boom in app (RuntimeError)"
    end
  end

  # A forked child closes the listening socket: once the server ends, the
  # port is free even while the child lives on.
  def test_forked_children_do_not_hold_the_port
    app = <<~RUBY
      child = fork { [$stdout, $stderr].each { |io| io.reopen(File::NULL) }; sleep 30 } # off our pipes
      Process.detach(child)
      File.write(ARGV[0] + ".child", child.to_s)
      sleep 0.05 until File.exist?(ARGV[0])
    RUBY
    Dir.mktmpdir do |dir|
      port = nil
      _, err, status = serve(dir, app_code: app) do |url, _|
        port = URI(url).port
      end
      assert status.success?, err
      child = File.read(File.join(dir, "stop.child")).to_i
      begin
        TCPServer.new("127.0.0.1", port).close # binds: nobody holds it
      ensure
        Process.kill(:KILL, child) rescue nil # rubocop:disable Style/RescueModifier
      end
    end
  end

  # --native reaches the served profile: zlib's own functions show.
  def test_native_frames_are_served
    skip "built without libunwind" unless Strobe::Native::NATIVE_FRAMES
    app = <<~RUBY
      require "zlib"
      text = "profile " * 50_000
      Zlib::Deflate.deflate(text, Zlib::BEST_COMPRESSION) until File.exist?(ARGV[0])
    RUBY
    Dir.mktmpdir do |dir|
      _, err, status = serve(dir, args: %w[--mode cpu --native], app_code: app) do |url, _|
        doc = nil
        wait_until(60) do
          doc = profile_of(get(url))
          native = doc["meta"]["categories"].index { |c| c["name"] == "Native" }
          doc["threads"].any? { |t| t["frameTable"]["category"].include?(native) }
        end
      end
      assert status.success?, err
    end
  end

  def test_cpu_mode_and_bad_command_lines
    Dir.mktmpdir do |dir|
      _, err, status = serve(dir, args: %w[--mode cpu --interval 500], app_code: BUSY) do |url, _|
        doc = profile_of(get(url))
        entries = doc["meta"]["extra"].find { |s| s["label"] == "Strobe" }["entries"].to_h { |e| [e["label"], e["value"]] }
        assert_equal "cpu", entries["mode"]
        assert_equal 500, entries["interval"]
      end
      assert status.success?, err
    end

    [
      [%w[serve], /no COMMAND given/],
      [%w[serve --port 70000 -- ruby -e 1], /70000 \(must be from 0 to 65535\)/],
      [%w[serve --mode fast -- ruby -e 1], /invalid mode: fast/],
      [%w[serve --mode trace -- ruby -e 1], /serve: mode trace cannot be served/],
      [%w[serve -- /no/such/program], /cannot run \/no\/such\/program: No such file or directory/],
    ].each do |args, message|
      _, err, status = run_command({}, RbConfig.ruby, "-I#{StrobeTestHelpers::LIB}", STROBE, *args)
      assert_equal 1, status.exitstatus, args.inspect
      assert_equal 1, err.lines.size, err
      assert_match message, err
    end
  end
end
