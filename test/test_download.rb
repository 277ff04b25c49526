# frozen_string_literal: true

# `strobe report URL` against servers on 127.0.0.1 written here: the ways
# an HTTP answer may come (chunked, up to the end of the connection, after
# interim responses), and servers that never finish answering, each of
# which must end in one `strobe: ...` line and exit status 1, bounded in
# time (the download's deadline) and in memory (the cap on the headers).
require "test_helper"
require "json"
require "socket"
require "stringio"
require "strobe/cli"

class TestDownload < Minitest::Test
  # The servers' loops end after this long whatever happens (the client's
  # run is killed after it as well): a safeguard against a hang.
  SAFEGUARD = 120

  PROFILE = { version: 1.2, mode: :custom, interval: nil, samples: 3, gc_samples: 0, missed_samples: 0, metadata: {},
              frames: { 1 => { name: "Worker#spin", file: "w.rb", line: 2, total_samples: 3, samples: 3 } } }.freeze

  def profile_json
    JSON.generate(Strobe::ProfileFile.encode(PROFILE))
  end

  # A server on 127.0.0.1 that reads each request, then hands the
  # connection to answer until it returns or the client goes away; yields
  # the URL, and returns how many connections it accepted.
  def serving(answer)
    accepted = 0
    server = TCPServer.new("127.0.0.1", 0)
    thread = Thread.new do
      loop do
        client = server.accept
        accepted += 1
        begin
          request = +""
          request << client.readpartial(4096) until request.include?("\r\n\r\n")
          answer.call(client)
        rescue IOError, SystemCallError
          nil # the client went away
        ensure
          client.close
        end
      end
    rescue IOError, SystemCallError
      nil # the server closed
    end
    yield "http://127.0.0.1:#{server.addr[1]}/p/strobe.json"
    accepted
  ensure
    server&.close
    thread&.kill&.join
  end

  # Calls the block again and again until the client goes away (its write
  # raises) or SAFEGUARD seconds have passed.
  def endlessly
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + SAFEGUARD
    yield while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
  end

  # `strobe report url` in a process of its own, the download's deadline
  # set to deadline seconds: [stdout, stderr, status].
  def report(url, deadline: nil)
    code = "require 'strobe/cli'; #{"Strobe::CLI::Download.deadline = #{deadline}; " if deadline}" \
           "exit Strobe::CLI.new(ARGV).run"
    run_ruby(code, args: ["report", url], timeout: SAFEGUARD)
  end

  def assert_fails_with(url, pattern, deadline: nil)
    out, err, status = report(url, deadline: deadline)
    assert_equal [1, ""], [status.exitstatus, out], err
    assert_equal 1, err.lines.size, "one line, got:\n#{err[0, 2000]}"
    assert_match(/\Astrobe: cannot download #{Regexp.escape(url)}: #{pattern.source}\n\z/, err)
  end

  # --- answers that are fine ------------------------------------------------

  def assert_reports(answer)
    serving(answer) do |url|
      out = StringIO.new
      err = StringIO.new
      assert_equal [0, ""], [Strobe::CLI.new(["report", url], out: out, err: err).run, err.string]
      assert_match(/^ +3 +\(100\.0%\) +3 +\(100\.0%\)     Worker#spin$/, out.string)
    end
  end

  def test_a_chunked_body
    body = profile_json
    chunks = body.scan(/.{1,50}/m).map { |part| "#{part.bytesize.to_s(16)};ext=1\r\n#{part}\r\n" }.join
    assert_reports(lambda do |client|
      client.write("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n#{chunks}0\r\nX-Trailer: 1\r\n\r\n")
    end)
  end

  def test_a_body_up_to_the_end_of_the_connection
    body = profile_json
    assert_reports(->(client) { client.write("HTTP/1.0 200 OK\nContent-Type: application/json\n\n#{body}") })
  end

  def test_interim_responses_before_the_answer
    body = Zlib.gzip(profile_json)
    assert_reports(lambda do |client|
      client.write("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" \
                   "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: #{body.bytesize}\r\n\r\n#{body}")
    end)
  end

  def test_answers_that_are_refused
    {
      "HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n{}" => /the connection closed after 2 of 500 bytes/,
      "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n{}" => /the server sent a malformed Content-Length/,
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n" => /the server sent malformed chunked data/,
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n" => /the server sent it with Transfer-Encoding gzip/,
      "SSH-2.0-OpenSSH\r\n\r\n" => /the server's answer is not an HTTP response/,
      "HTTP/1.1 200 OK\r\n" => /the connection closed before the response was complete/,
      "HTTP/1.1 301 Moved Permanently\r\nLocation: /\r\n\r\n" => /HTTP 301 Moved Permanently/,
    }.each do |response, pattern|
      serving(->(client) { client.write(response) }) do |url|
        err = StringIO.new
        assert_equal 1, Strobe::CLI.new(["report", url], out: StringIO.new, err: err).run, response
        assert_equal 1, err.string.lines.size, err.string
        assert_match(/\Astrobe: cannot download #{Regexp.escape(url)}: #{pattern.source}$/, err.string)
      end
    end
  end

  # --- servers that never finish ------------------------------------------------

  # Header lines without end: the first 64 KB of them are all that is read.
  def test_endless_headers
    accepted = serving(lambda do |client|
      client.write("HTTP/1.1 200 OK\r\n")
      n = 0
      endlessly { client.write("X-Header-#{n += 1}: #{'v' * 100}\r\n") }
    end) { |url| assert_fails_with(url, /the response's status line and headers are over 64 KB/) }
    assert_equal 1, accepted
  end

  def test_an_endless_header_line
    serving(lambda do |client|
      client.write("HTTP/1.1 200 OK\r\nX-Long: ")
      endlessly { client.write("a" * 4096) }
    end) { |url| assert_fails_with(url, /the response's status line and headers are over 64 KB/) }
  end

  # Interim responses count towards the 64 KB of headers.
  def test_endless_interim_responses
    serving(lambda do |client|
      endlessly { client.write("HTTP/1.1 100 Continue\r\n\r\n") }
    end) { |url| assert_fails_with(url, /the response's status line and headers are over 64 KB/) }
  end

  # A body trickling in: the deadline is for the whole download, not for
  # each read.
  def test_a_trickling_body
    serving(lambda do |client|
      client.write("HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
      endlessly do
        client.write("{")
        sleep 0.1
      end
    end) { |url| assert_fails_with(url, /the server did not send the whole profile within 2 s/, deadline: 2) }
  end

  def test_trickling_headers
    serving(lambda do |client|
      client.write("HTTP/1.1 200 OK\r\n")
      endlessly do
        client.write("X: 1\r\n")
        sleep 0.1
      end
    end) { |url| assert_fails_with(url, /the server did not send the whole profile within 2 s/, deadline: 2) }
  end

  # No answer at all, asked once: Net::HTTP asked twice, taking twice its
  # read timeout.
  def test_silence
    accepted = serving(->(client) { client.wait_readable(SAFEGUARD) }) do |url|
      assert_fails_with(url, /the server did not send the whole profile within 2 s/, deadline: 2)
    end
    assert_equal 1, accepted
  end

  def test_the_deadline_is_a_minute_by_default
    assert_equal 60, Strobe::CLI::Download.deadline
  end
end
