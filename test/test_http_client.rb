# frozen_string_literal: true

# Strobe::HTTPClient against servers on 127.0.0.1 written here, plain and
# TLS (with a certificate authority made for the test): the request as the
# server reads it, the ways an answer may come, bodies over the limit, and
# servers that never finish answering or are not what the URL says, each of
# which must end in an HTTPClient::Error, bounded in time (the deadline)
# and in memory (the caps).
require "test_helper"
require "openssl"
require "socket"
require "strobe/http_client"

class TestHTTPClient < Minitest::Test
  # The servers' loops end after this long whatever happens: a safeguard
  # against a hang, not a timing check.
  SAFEGUARD = 60
  # What a deadline may be overrun by before a test fails (generous: a
  # loaded machine).
  SLACK = 10

  Error = Strobe::HTTPClient::Error

  # A server on 127.0.0.1 (TLS with the context tls) that reads each
  # request, head and body (unless reading is false), then hands the
  # connection to answer until it returns or the client goes away; yields
  # the base URL and a Queue of the requests read. A connection that fails
  # its handshake is dropped.
  def serving(answer, tls: nil, host: "127.0.0.1", reading: true)
    requests = Queue.new
    server = TCPServer.new(host, 0)
    thread = Thread.new do
      loop do
        socket = server.accept
        begin
          client = tls ? OpenSSL::SSL::SSLSocket.new(socket, tls).tap(&:accept) : socket
          requests << read_request(client) if reading
          answer.call(client)
        rescue IOError, SystemCallError, OpenSSL::SSL::SSLError
          nil # the client went away
        ensure
          client&.close
          socket.close
        end
      end
    rescue IOError, SystemCallError
      nil # the server closed
    end
    name = host.include?(":") ? "[#{host}]" : host
    yield "#{tls ? 'https' : 'http'}://#{name}:#{server.addr[1]}", requests
  ensure
    server&.close
    thread&.kill&.join
  end

  # A request's head and its body (by Content-Length), as sent.
  def read_request(client)
    request = "".b
    request << client.readpartial(65_536) until request.include?("\r\n\r\n")
    length = request[/^Content-Length: (\d+)\r$/i, 1].to_i
    request << client.readpartial(65_536) while request.bytesize < request.index("\r\n\r\n") + 4 + length
    request
  end

  def answering(response, **options, &block)
    serving(->(client) { client.write(response) }, **options, &block)
  end

  # Calls the block again and again until the client goes away (its write
  # raises) or SAFEGUARD seconds have passed.
  def endlessly
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + SAFEGUARD
    yield while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
  end

  def client(deadline: 10, **options)
    Strobe::HTTPClient.new(deadline: deadline, **options)
  end

  # The error the block raises, checked to be one line, and how long the
  # block took.
  def failure
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    error = assert_raises(Error) { yield }
    assert_equal 1, error.message.lines.size, error.message
    [error, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started]
  end

  # --- the request ----------------------------------------------------------

  def test_a_post_as_the_server_reads_it
    body = Zlib.gzip(Random.new(1).bytes(100_000))
    answering("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nX-Id: a\r\nx-id: b\r\n\r\nok\n") do |url, requests|
      headers = { "Content-Type" => "application/octet-stream", "Authorization" => "Bearer t" }
      response = client.request("#{url}/ingest?name=x&from=1", method: "POST", headers: headers, body: body,
                                body_limit: 64 * 1024)
      assert_equal "POST /ingest?name=x&from=1 HTTP/1.1\r\nHost: 127.0.0.1:#{URI(url).port}\r\n" \
                   "Content-Type: application/octet-stream\r\nAuthorization: Bearer t\r\n" \
                   "User-Agent: strobe/#{Strobe::VERSION}\r\nConnection: close\r\n" \
                   "Content-Length: #{body.bytesize}\r\n\r\n#{body}".b, requests.pop
      assert_equal [200, "OK", { "content-length" => ["3"], "x-id" => %w[a b] }, "ok\n"],
                   [response.code, response.reason, response.headers, response.body]
      assert_equal "a, b", response["X-Id"]
      refute response.truncated?
    end
  end

  # User information in the URL is basic authentication, percent-decoded;
  # an Authorization given wins; a Host given replaces the URL's.
  def test_authentication_from_the_url
    answering("HTTP/1.1 204 No Content\r\n\r\n") do |url, requests|
      credentials = url.sub("://", "://us%40er:p%3Ass@")
      assert_equal 204, client.request("#{credentials}/").code
      assert_includes requests.pop, "\r\nAuthorization: Basic #{['us@er:p:ss'].pack('m0')}\r\n"
      client.request(credentials, headers: { "authorization" => "Bearer t", "Host" => "example.test" })
      request = requests.pop
      assert_match(/\AGET \/ HTTP\/1.1\r\nHost: example.test\r\nauthorization: Bearer t\r\nUser-Agent: /, request)
      refute_includes request, "Basic"
    end
  end

  def test_requests_refused_before_anything_is_sent
    {
      ["ftp://127.0.0.1/x", {}] => /\Aonly http:\/\/ and https:\/\/ URLs are supported\z/,
      ["http:///x", {}] => /\Athe URL names no host\z/,
      ["http://a b/", {}] => /\Anot a valid URL \(/,
      ["http://127.0.0.1:1/", { "X-Tenant" => "a\r\nX-Evil: 1" }] => /\Athe X-Tenant header's value has a line break/,
      ["http://127.0.0.1:1/", { "Bad Name" => "1" }] => /\A"Bad Name" is not a header name\z/,
      ["http://127.0.0.1:1/", { "Content-Length" => "1" }] => /\Athe Content-Length header may not be given\z/,
    }.each do |(url, headers), pattern|
      error, = failure { client.request(url, headers: headers) }
      assert_match pattern, error.message
    end
  end

  def test_an_ipv6_literal
    begin
      TCPServer.new("::1", 0).close
    rescue SystemCallError => e
      skip "no IPv6 loopback here (#{e.message})"
    end
    answering("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nv6", host: "::1") do |url, requests|
      assert_equal "v6", client.request("#{url}/x").body
      assert_includes requests.pop, "\r\nHost: [::1]:#{URI(url).port}\r\n"
    end
  end

  # --- answers ----------------------------------------------------------------

  def test_ways_an_answer_may_come
    chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" \
              "5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: 1\r\n\r\n"
    {
      chunked => [200, "hello, world"],
      "HTTP/1.0 200 OK\nX-Folded: a\n b\n\nup to the end" => [200, "up to the end"],
      "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" \
      "HTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\nmade" => [201, "made"],
      "HTTP/1.1 404 Not Found\r\nContent-Length: 10\r\n\r\nnot found\n" => [404, "not found\n"],
      "HTTP/1.1 503\r\nContent-Length: 0\r\n\r\n" => [503, ""],
    }.each do |answer, (code, body)|
      answering(answer) do |url|
        response = client.request(url)
        assert_equal [code, body, false], [response.code, response.body, response.truncated?], answer
      end
    end
  end

  def test_a_head_request_has_no_body
    answering("HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n") do |url, requests|
      response = client.request(url, method: "HEAD")
      assert_equal [200, "", nil], [response.code, response.body, response.content_length]
      assert_equal "1000", response["Content-Length"]
      assert_match(/\AHEAD \/ HTTP\/1.1\r\n/, requests.pop)
    end
  end

  # A body over the limit is cut at it, however it is framed, and nothing
  # beyond is read; one of exactly the limit is whole.
  def test_bodies_over_the_limit_are_cut_at_it
    body = Random.new(2).bytes(300_000)
    chunks = body.scan(/.{1,7000}/mn).map { |part| "#{part.bytesize.to_s(16)}\r\n#{part}\r\n" }.join
    {
      "Content-Length: #{body.bytesize}\r\n\r\n#{body}" => :length,
      "Transfer-Encoding: chunked\r\n\r\n#{chunks}0\r\n\r\n" => :chunked,
      "\r\n#{body}" => :to_end,
    }.each do |rest, framing|
      answering("HTTP/1.1 200 OK\r\n#{rest}".b) do |url|
        [[64 * 1024, true], [body.bytesize, false], [body.bytesize + 1, false]].each do |limit, cut|
          response = client.request(url, body_limit: limit)
          assert_equal [body.byteslice(0, limit), cut], [response.body, response.truncated?], [framing, limit].inspect
        end
      end
    end
  end

  # An endless body ends at the limit, without waiting for more.
  def test_an_endless_body_ends_at_the_limit
    serving(lambda do |client|
      client.write("HTTP/1.1 200 OK\r\n\r\n")
      endlessly { client.write("x" * 4096) }
    end) do |url|
      response = client(deadline: SAFEGUARD).request(url, body_limit: 100_000)
      assert_equal ["x" * 100_000, true], [response.body, response.truncated?]
    end
  end

  # With a block: the response before its body, then its body as it comes,
  # up to the limit; the block's value is request's.
  def test_streaming_the_body
    body = Random.new(3).bytes(500_000)
    answering("HTTP/1.1 200 OK\r\nContent-Length: #{body.bytesize}\r\n\r\n#{body}".b) do |url|
      parts = []
      value = client.request(url, body_limit: 400_000) do |response|
        assert_equal [200, nil, body.bytesize], [response.code, response.body, response.content_length]
        response.read_body { |part| parts << part }
        response.truncated? ? :cut : :whole
      end
      assert_equal :cut, value
      assert_equal body.byteslice(0, 400_000), parts.join
      assert_operator parts.size, :>, 1
    end
  end

  def test_answers_that_are_errors
    {
      "HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n{}" => /\Athe connection closed after 2 of 500 bytes\z/,
      "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n" => /\Athe server sent a malformed Content-L/,
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n" => /\Athe server sent malformed chunked data\z/,
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nabc" => /\Athe connection closed in the middle of/,
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n" => /\Athe server sent it with Transfer-Encoding gzip\z/,
      "HTTP/1.1 200 OK\r\nBad Header\r\n\r\n" => /\Athe server sent a malformed header line\z/,
      "SSH-2.0-OpenSSH\r\n\r\n" => /\Athe server's answer is not an HTTP response\z/,
      "HTTP/1.1 200 OK\r\n" => /\Athe connection closed before the response was complete\z/,
    }.each do |answer, pattern|
      answering(answer) do |url|
        error, = failure { client.request(url) }
        assert_match pattern, error.message, answer
      end
    end
  end

  # --- servers that fail or never finish ------------------------------------------

  def test_a_refused_connection
    port = TCPServer.open("127.0.0.1", 0) { |server| server.addr[1] } # free once closed
    error, = failure { client.request("http://127.0.0.1:#{port}/") }
    assert_equal "Connection refused", error.message
  end

  def test_a_reset_connection
    serving(lambda do |client|
      client.setsockopt(Socket::SOL_SOCKET, Socket::SO_LINGER, [1, 0].pack("ii")) # close sends RST
    end) do |url|
      error, = failure { client.request(url) }
      # (reset before or after the client's read began)
      assert_includes ["Connection reset by peer", "the connection closed before the response was complete"],
                      error.message
    end
  end

  def test_silence
    serving(->(client) { client.wait_readable(SAFEGUARD) }) do |url|
      error, seconds = failure { client(deadline: 1).request(url) }
      assert_kind_of Strobe::HTTPClient::Timeout, error
      assert_equal "the server did not answer within 1 s", error.message
      assert_operator seconds, :<, 1 + SLACK
    end
  end

  # Header lines without end: the first 64 KB of them are all that is read.
  def test_endless_headers
    serving(lambda do |client|
      client.write("HTTP/1.1 200 OK\r\n")
      n = 0
      endlessly { client.write("X-Header-#{n += 1}: #{'v' * 100}\r\n") }
    end) do |url|
      error, = failure { client(deadline: SAFEGUARD).request(url) }
      assert_equal "the response's status line and headers are over 64 KB", error.message
    end
  end

  # Interim responses count towards the cap too.
  def test_endless_interim_responses
    serving(->(client) { endlessly { client.write("HTTP/1.1 100 Continue\r\n\r\n") } }) do |url|
      error, = failure { client(deadline: SAFEGUARD).request(url) }
      assert_equal "the response's status line and headers are over 64 KB", error.message
    end
  end

  # Headers trickling in: the deadline is for the whole request, not for
  # each read.
  def test_trickling_headers
    serving(lambda do |client|
      client.write("HTTP/1.1 200 OK\r\n")
      endlessly do
        client.write("X: 1\r\n")
        sleep 0.05
      end
    end) do |url|
      error, seconds = failure { client(deadline: 1).request(url) }
      assert_equal "the server did not answer within 1 s", error.message
      assert_operator seconds, :<, 1 + SLACK
    end
  end

  # A server that does not read the body: the write gives up at the
  # deadline.
  def test_a_server_that_does_not_read_the_request
    server = TCPServer.new("127.0.0.1", 0)
    body = "x" * (64 << 20) # more than the kernel's buffers take
    url = "http://127.0.0.1:#{server.addr[1]}/"
    error, seconds = failure { client(deadline: 1).request(url, method: "PUT", body: body) }
    assert_equal "the server did not take the request within 1 s", error.message
    assert_operator seconds, :<, 1 + SLACK
  ensure
    server&.close
  end

  # --- https ------------------------------------------------------------------------

  # A certificate authority and server certificates it signed, made once:
  # {ca_file: PEM file, localhost: [cert, key], elsewhere: [cert, key]}.
  def self.pki
    @pki ||= begin
      ca_key = OpenSSL::PKey::EC.generate("prime256v1")
      ca = certificate("/CN=Strobe test CA", ca_key, nil, ca_key,
                       [["basicConstraints", "CA:TRUE", true], ["keyUsage", "keyCertSign, cRLSign", true]])
      ca_file = File.join(Dir.mktmpdir("strobe-pki"), "ca.pem")
      File.write(ca_file, ca.to_pem)
      servers = { localhost: "DNS:localhost,IP:127.0.0.1", elsewhere: "DNS:elsewhere.test" }.transform_values do |names|
        key = OpenSSL::PKey::EC.generate("prime256v1")
        [certificate("/CN=#{names[/DNS:([^,]+)/, 1]}", key, ca, ca_key,
                     [["basicConstraints", "CA:FALSE", true], ["subjectAltName", names, false],
                      ["extendedKeyUsage", "serverAuth", false]]), key]
      end
      { ca_file: ca_file, **servers }
    end
  end

  def self.certificate(subject, key, issuer, issuer_key, extensions)
    cert = OpenSSL::X509::Certificate.new
    cert.version = 2
    cert.serial = Random.new.rand(1 << 62)
    cert.subject = OpenSSL::X509::Name.parse(subject)
    cert.issuer = issuer ? issuer.subject : cert.subject
    cert.public_key = key
    cert.not_before = Time.now - 3600
    cert.not_after = Time.now + 24 * 3600
    factory = OpenSSL::X509::ExtensionFactory.new(issuer || cert, cert)
    extensions += [["subjectKeyIdentifier", "hash", false], ["authorityKeyIdentifier", "keyid:always", false]]
    extensions.each { |name, value, critical| cert.add_extension(factory.create_extension(name, value, critical)) }
    cert.sign(issuer_key, "SHA256")
  end

  def pki
    self.class.pki
  end

  # A server's TLS context with the certificate for server (:localhost,
  # :elsewhere).
  def tls(server)
    OpenSSL::SSL::SSLContext.new.tap { |context| context.cert, context.key = pki.fetch(server) }
  end

  # By IP address (its SAN) and by name (SNI, the names's SAN), a body large
  # enough to wait for the socket on the way out, an answer to the end of
  # the connection on the way back.
  def test_https_with_the_ca_file
    body = Random.new(4).bytes(4 << 20)
    names = Queue.new
    context = tls(:localhost).tap { |c| c.servername_cb = ->((_, name)) { names << name && nil } }
    answering("HTTP/1.1 200 OK\r\nX: 1\r\n\r\nsecret", tls: context) do |url, requests|
      [url, url.sub("127.0.0.1", "localhost")].each do |base|
        response = client(ca_file: pki[:ca_file]).request("#{base}/in", method: "POST", body: body)
        assert_equal [200, "secret"], [response.code, response.body]
        request = requests.pop
        assert_equal body, request.byteslice(request.index("\r\n\r\n") + 4..)
        assert_match(/\r\nHost: (127\.0\.0\.1|localhost):\d+\r\n/, request)
      end
      assert_equal "localhost", names.pop(true) # no SNI for the IP address
      assert names.empty?
    end
  end

  def test_https_with_a_certificate_the_system_does_not_trust
    answering("HTTP/1.1 200 OK\r\n\r\n", tls: tls(:localhost)) do |url, requests|
      error, = failure { client.request(url) }
      assert_match(/\ATLS certificate verification failed: .*(certificate|issuer)/, error.message)
      assert requests.empty?
    end
  end

  def test_https_with_a_certificate_for_another_host
    answering("HTTP/1.1 200 OK\r\n\r\n", tls: tls(:elsewhere)) do |url, requests|
      [url, url.sub("127.0.0.1", "localhost")].each do |other|
        error, = failure { client(ca_file: pki[:ca_file]).request(other) }
        assert_match(/\ATLS certificate verification failed: .*(hostname|match)/, error.message)
      end
      assert requests.empty?
    end
  end

  def test_https_to_a_server_without_tls
    answering("HTTP/1.1 400 Bad Request\r\n\r\n", reading: false) do |url|
      error, = failure { client(ca_file: pki[:ca_file]).request(url.sub("http:", "https:")) }
      assert_match(/\ATLS handshake failed: /, error.message)
    end
  end

  def test_https_to_a_silent_server
    server = TCPServer.new("127.0.0.1", 0)
    error, seconds = failure { client(deadline: 1).request("https://127.0.0.1:#{server.addr[1]}/") }
    assert_kind_of Strobe::HTTPClient::ConnectTimeout, error
    assert_equal "no TLS connection within 1 s", error.message
    assert_operator seconds, :<, 1 + SLACK
  ensure
    server&.close
  end

  def test_ca_files_that_cannot_be_used
    garbage = File.join(File.dirname(pki[:ca_file]), "garbage.pem")
    File.write(garbage, "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    answering("HTTP/1.1 200 OK\r\n\r\n", tls: tls(:localhost)) do |url, requests|
      error, = failure { client(ca_file: "/nonexistent/ca.pem").request(url) }
      assert_equal "cannot use the CA file /nonexistent/ca.pem: it cannot be read", error.message
      error, = failure { client(ca_file: garbage).request(url) }
      assert_match(/\Acannot use the CA file #{Regexp.escape(garbage)}: ./, error.message)
      assert requests.empty?
    end
  end

  # Loading OpenSSL is slow: an http:// request does not.
  def test_openssl_is_loaded_for_https_only
    answering("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok") do |url|
      code = "require 'strobe/http_client'; print Strobe::HTTPClient.new(deadline: 10).request(ARGV[0]).body, " \
             "defined?(OpenSSL).inspect"
      out, err, status = run_ruby(code, args: [url], timeout: SAFEGUARD)
      assert status.success?, err
      assert_equal "oknil", out
    end
  end
end
