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
# as Firefox Profiler JSON on 127.0.0.1, with the CORS header the profiler
# needs, and keeps serving it after it ends, until interrupted.
class TestServe < Minitest::Test
  include FirefoxChecks

  STROBE = File.join(StrobeTestHelpers::ROOT, "exe/strobe")

  # A program that computes on two threads until the file `stop` appears,
  # and starts another Ruby process on the way (which cannot bind the port).
  APP = <<~RUBY
    def busy = 20_000.times.sum
    ticker = Thread.new { loop { busy; sleep 0.002 } }
    ticker.name = "ticker"
    system(RbConfig.ruby, "-e", "puts :child_ran")
    busy until File.exist?(ARGV[0])
  RUBY

  # Runs `strobe serve` on app; yields the profile's URL and a lambda
  # returning stderr so far, then interrupts it. Returns [stdout, stderr,
  # status].
  def serve(dir, args: [], app_code: APP)
    app = File.join(dir, "app.rb")
    File.write(app, app_code)
    env = {} # as this process: under rake test:asan, the sanitizer build
    stdin, stdout, stderr, wait = Open3.popen3(env, RbConfig.ruby, "-I#{StrobeTestHelpers::LIB}", STROBE, "serve",
                                               "--port", "0", *args, "--", RbConfig.ruby, app, File.join(dir, "stop"),
                                               pgroup: true)
    stdin.close
    err = +""
    reader = Thread.new { stderr.each_line { |line| err << line } }
    out = Thread.new { stdout.read }
    url = nil
    # Both lines of the announcement (two writes: the reader may have the
    # first only).
    Timeout.timeout(60) do
      sleep 0.05 until (url = err[%r{at (http://127\.0\.0\.1:\d+/profile\.json)}, 1]) && err.include?("strobe: open ")
    end
    yield url, -> { err }
    # Ctrl-C once the program has ended (earlier, it would end the program,
    # and the profile would then stay served until a second one).
    File.write(File.join(dir, "stop"), "")
    Timeout.timeout(60) { sleep 0.05 until err.include?("its profile is still served") }
    Process.kill(:INT, wait.pid)
    status = Timeout.timeout(60) { wait.value }
    reader.join
    [out.value, err, status]
  ensure
    Process.kill(:KILL, -wait.pid) if wait&.alive?
  end

  def get(url, headers = {})
    uri = URI(url)
    Net::HTTP.start(uri.host, uri.port, open_timeout: 10, read_timeout: 60) do |http|
      http.request(Net::HTTP::Get.new(uri, headers))
    end
  end

  def profile_of(response)
    body = response["content-encoding"] == "gzip" ? Zlib.gunzip(response.body) : response.body
    JSON.parse(body)
  end

  def sample_count(doc)
    doc["threads"].sum { |t| t["samples"]["length"] }
  end

  def test_serves_the_profile_so_far_then_after_the_program_ends
    Dir.mktmpdir do |dir|
      out, err, status = serve(dir) do |url, stderr|
        assert_match %r{\Ahttp://127\.0\.0\.1:\d+/profile\.json\z}, url
        assert_includes stderr.call, "strobe: open https://profiler.firefox.com/from-url/#{URI.encode_www_form_component(url)}"

        # until the ticker thread has run (it registers as it starts)
        first = nil
        Timeout.timeout(30) do
          loop do
            response = get(url)
            if response.code == "200" && profile_of(response)["threads"].any? { |t| t["name"] == "ticker" }
              first = response
              break
            end
            sleep 0.05
          end
        end
        assert_equal "200", first.code
        assert_equal "*", first["access-control-allow-origin"]
        assert_equal "application/json", first["content-type"]
        doc = profile_of(first)
        assert_firefox_invariants(doc)
        names = doc["threads"].map { |t| t["name"] }
        assert_includes names, "main"
        assert_includes names, "ticker"
        refute_includes names, "strobe serve", "the server's own thread is not profiled"

        # each GET returns everything so far, gzipped when asked
        sleep 0.2
        second = get(url, "Accept-Encoding" => "gzip")
        assert_equal "gzip", second["content-encoding"]
        assert_operator sample_count(profile_of(second)), :>, sample_count(doc)

        assert_equal "404", get(url.sub("profile.json", "nope")).code
        assert_match(/from-url/, get(url.sub("profile.json", "")).body)
        uri = URI(url)
        post = Net::HTTP.start(uri.host, uri.port) { |http| http.request(Net::HTTP::Post.new(uri)) }
        assert_equal "405", post.code

        File.write(File.join(dir, "stop"), "")
        Timeout.timeout(60) { sleep 0.05 until stderr.call.include?("its profile is still served") }
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

  # A client that asks and never reads, or sends its request a byte at a
  # time, is dropped at a deadline; meanwhile nobody else is kept waiting
  # longer than that.
  def test_a_stalled_client_is_dropped
    Dir.mktmpdir do |dir|
      _, err, status = serve(dir) do |url, _|
        uri = URI(url)
        stalled = TCPSocket.new(uri.host, uri.port)
        stalled.write("GET /profile.json HTTP/1.1\r\nHost: x\r\n\r\n") # and never reads
        slow = TCPSocket.new(uri.host, uri.port)
        slow.write("GE") # and never finishes
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        response = get(url)
        assert_equal "200", response.code
        waited = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
        # a safeguard against waiting forever, not a timing check
        assert_operator waited, :<, Strobe::Serve::RESPONSE_TIMEOUT + Strobe::Serve::REQUEST_TIMEOUT + 30
        [stalled, slow].each(&:close)
      end
      assert status.success?, err
    end
  end

  # The deadlines themselves, on a socket pair: a reader that never reads
  # makes the writer give up; a request dripped a byte a second is dropped
  # at the request deadline, not read for as long as it keeps dripping.
  def test_deadlines
    reader, writer = UNIXSocket.pair
    out = Strobe::Serve::DeadlineWriter.new(writer, Process.clock_gettime(Process::CLOCK_MONOTONIC) + 0.5)
    assert_raises(Strobe::Serve::Timeout) { out.write("x" * (64 << 20)) }
    [reader, writer].each(&:close)

    server = Strobe::Serve.new(0, err: StringIO.new)
    client, dripper = UNIXSocket.pair
    drip = Thread.new { loop { dripper.write("G"); sleep 1 } rescue nil } # rubocop:disable Style/RescueModifier
    request = Timeout.timeout(Strobe::Serve::REQUEST_TIMEOUT + 30) { server.send(:read_request, client) }
    assert_nil request
  ensure
    drip&.kill
    server&.stop
    [client, dripper].compact.each(&:close)
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
        Timeout.timeout(60) { sleep 0.05 until stderr.call.include?("still served") }
        assert_includes stderr.call, "strobe: the program ended with RuntimeError: boom in app"
      end
      assert_equal "output of the program", out
      assert_equal 1, status.exitstatus
      assert_includes err, "boom in app (RuntimeError)"
    end
  end

  def test_cpu_mode_and_bad_command_lines
    Dir.mktmpdir do |dir|
      _, err, status = serve(dir, args: %w[--mode cpu --interval 500]) do |url, _|
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
      [%w[serve -- /no/such/program], /cannot run \/no\/such\/program: No such file or directory/],
    ].each do |args, message|
      _, err, status = run_command({}, RbConfig.ruby, "-I#{StrobeTestHelpers::LIB}", STROBE, *args)
      assert_equal 1, status.exitstatus, args.inspect
      assert_equal 1, err.lines.size, err
      assert_match message, err
    end
  end
end
