# frozen_string_literal: true

# Strobe's HTTP/1.1 client, for `strobe report URL`'s download and for
# sending profiles away: one request per connection, http:// or https://,
# bounded in time and memory whatever the server does.

require "socket"
require "uri"
require_relative "redact"
require_relative "version"

module Strobe
  # One HTTP/1.1 request and its response:
  #
  #   client = HTTPClient.new(deadline: 10)
  #   response = client.request("https://host/ingest", method: "POST", headers: {...}, body: data)
  #   response.code, response.reason, response.headers, response.body
  #
  # or, to stream the body as it comes:
  #
  #   client.request(url) { |response| response.read_body { |chunk| ... } }
  #
  # Of its own rather than Net::HTTP, which reads header lines into a
  # buffer without a bound, has no deadline for the whole exchange and
  # retries a request that timed out: here one deadline covers everything
  # from resolving the host to the last byte of the body; the status line
  # and headers are capped (interim 1xx responses count towards the cap);
  # the body, by Content-Length, chunked or up to the end of the connection,
  # is kept or yielded up to a limit, and what is beyond it is not read.
  # Every failure is an Error with a one-line message; a status other than
  # 200 is a response like any other.
  class HTTPClient
    # Why a request failed: its message is one line, for people.
    class Error < StandardError; end

    # The deadline passed before a connection (and its TLS handshake) was made.
    class ConnectTimeout < Error; end

    # The deadline passed once connected: the server did not take the
    # request or did not answer all of it in time.
    class Timeout < Error; end

    # The most the status line and headers may be, interim responses included.
    HEAD_LIMIT = 64 << 10
    # The longest line giving a chunk's size (with extensions).
    CHUNK_LINE_LIMIT = 4 << 10
    # The most of a body kept unless the request says otherwise.
    BODY_LIMIT = 1 << 20
    # What is read from or written to the socket at once.
    IO_SIZE = 64 << 10
    # A header's name, a method (RFC 9110's token).
    TOKEN = /\A[!#$%&'*+\-.^_`|~0-9A-Za-z]+\z/
    # Headers the client writes itself: the framing of one request per connection.
    OWN_HEADERS = %w[connection content-length transfer-encoding].freeze
    # What Socket.tcp raises at its timeouts (IO::TimeoutError from Ruby 3.2).
    CONNECT_TIMEOUTS = [Errno::ETIMEDOUT, (IO::TimeoutError if defined?(IO::TimeoutError))].compact.freeze

    # deadline: seconds each request may take, all of it; ca_file: a PEM file
    # of the certificate authorities trusted for https:// (by default the
    # system's, OpenSSL's default paths).
    def initialize(deadline:, ca_file: nil, head_limit: HEAD_LIMIT, chunk_line_limit: CHUNK_LINE_LIMIT)
      @seconds = deadline
      @ca_file = ca_file
      @head_limit = head_limit
      @chunk_line_limit = chunk_line_limit
    end

    # Sends the request and reads the final response (interim 1xx ones are
    # skipped). Without a block, returns the Response with at most
    # body_limit bytes of its body. With one, yields the Response before its
    # body is read (Response#read_body streams it, up to body_limit bytes)
    # and returns what the block returns; the connection closes after.
    # body is a String (a POST, PUT or PATCH without one sends an empty
    # one). User information in the URL is sent as basic authentication
    # unless headers has an Authorization. Raises Error.
    def request(url, method: "GET", headers: {}, body: nil, body_limit: BODY_LIMIT)
      method = method.to_s
      uri = parse(url)
      body ||= "" if %w[POST PUT PATCH].include?(method)
      head = request_head(uri, method, headers, body)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + @seconds
      io = open(uri, deadline)
      connection = Connection.new(io, deadline, @seconds)
      connection.write(head)
      connection.write(body) if body
      response = read_response(connection, body_limit, method == "HEAD")
      return yield(response) if block_given?

      response.read_body
      response
    ensure
      io&.close
    end

    private

    # The URL as a URI::HTTP (or HTTPS) with a host; raises Error.
    def parse(url)
      uri = URI(url)
      raise Error, "only http:// and https:// URLs are supported" unless uri.is_a?(URI::HTTP)
      raise Error, "the URL names no host" if uri.hostname.to_s.empty?

      uri
    rescue URI::InvalidURIError, ArgumentError => e
      raise Error, "not a valid URL (#{Redact.uri_error(e)})" # (its message quotes the URL)
    end

    # The request line and headers: Host first (the one given, else the
    # URL's host, with its port unless the scheme's own), the headers given
    # in their order, then authentication from the URL, User-Agent unless
    # given, Connection: close and the body's Content-Length.
    def request_head(uri, method, headers, body)
      raise Error, "#{method.inspect} is not an HTTP method" unless method.match?(TOKEN)

      fields = headers.map { |name, value| field(name.to_s, value.to_s) }
      host, fields = fields.partition { |name, _| name.casecmp?("host") }
      default_host = uri.port == uri.default_port ? uri.host : "#{uri.host}:#{uri.port}"
      fields.unshift(["Host", host.empty? ? default_host : host.last[1]])
      fields << ["Authorization", HTTPClient.basic_authorization(uri)] if uri.user && !given?(fields, "authorization")
      fields << ["User-Agent", "strobe/#{VERSION}"] unless given?(fields, "user-agent")
      fields << %w[Connection close]
      fields << ["Content-Length", body.bytesize.to_s] if body
      "#{method} #{uri.request_uri} HTTP/1.1\r\n#{fields.map { |name, value| "#{name}: #{value}\r\n" }.join}\r\n"
    end

    # [name, value (its bytes)], refused when it could end the header or
    # start another, or is one the client writes itself.
    def field(name, value)
      raise Error, "#{name.inspect} is not a header name" unless name.match?(TOKEN)
      raise Error, "the #{name} header may not be given" if OWN_HEADERS.include?(name.downcase)
      raise Error, "the #{name} header's value has a line break or NUL in it" if value.match?(/[\r\n\0]/n)

      [name, value.b]
    end

    # Whether fields has a header of that name (any case).
    def given?(fields, name)
      fields.any? { |given, _| given.casecmp?(name) }
    end

    # A socket to the URL's host (TLS for https://), connected before the
    # deadline.
    def open(uri, deadline)
      tls = TLS.new(uri.hostname, @ca_file) if uri.is_a?(URI::HTTPS)
      left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
      raise ConnectTimeout, "no connection within #{@seconds} s" unless left.positive?

      socket = Socket.tcp(uri.hostname, uri.port, connect_timeout: left, resolv_timeout: left)
      socket.setsockopt(Socket::IPPROTO_TCP, Socket::TCP_NODELAY, 1) # the head and the body go as written
      tls ? tls.connect(socket, deadline, @seconds) : socket
    rescue *CONNECT_TIMEOUTS
      raise ConnectTimeout, "no connection within #{@seconds} s"
    rescue SystemCallError => e
      raise Error, HTTPClient.system_reason(e)
    rescue SocketError, IOError => e
      raise Error, e.message
    end

    # The final response's status and headers, after any interim (1xx)
    # responses; its body is left to read.
    def read_response(connection, body_limit, head_request)
      budget = @head_limit
      loop do
        lines = []
        loop do
          line = connection.line(budget)
          raise Error, "the response's status line and headers are over #{@head_limit >> 10} KB" unless line

          budget -= line.bytesize + 2
          break if line.empty? && !lines.empty? # (empty lines before a status line are skipped)

          lines << line unless line.empty?
        end
        code, reason, headers = parse_head(lines)
        next if code.between?(100, 199) && code != 101

        bodiless = head_request || code.between?(100, 199) || code == 204 || code == 304
        body = Body.new(connection, headers, limit: body_limit, line_limit: @chunk_line_limit, none: bodiless)
        return Response.new(code, reason, headers, body)
      end
    end

    # [code, reason, {"lowercase-name" => [values]}] of a status line and
    # its header lines.
    def parse_head(lines)
      status = lines.shift.to_s.match(%r{\AHTTP/1\.[01] (\d\d\d)(?: (.*))?\z}n)
      raise Error, "the server's answer is not an HTTP response" unless status

      headers = {}
      last = nil
      lines.each do |line|
        if line.start_with?(" ", "\t") && last # a folded line continues the header before
          last[-1] = "#{last[-1]} #{line.strip}"
          next
        end
        name, value = line.split(":", 2)
        raise Error, "the server sent a malformed header line" unless value && name.match?(TOKEN)

        last = (headers[name.downcase] ||= [])
        last << value.strip
      end
      [status[1].to_i, status[2].to_s.strip, headers]
    end

    class << self
      # The Authorization of the URL's user and password (percent-decoded).
      def basic_authorization(uri)
        credentials = [uri.user, uri.password.to_s].map { |part| URI::DEFAULT_PARSER.unescape(part) }.join(":")
        "Basic #{[credentials].pack('m0')}"
      end

      # The reason without the call Ruby adds ("Connection refused", not
      # "Connection refused - connect(2) for ...").
      def system_reason(error)
        error.class < SystemCallError ? error.class.new.message : error.message
      end

      # Whether io became ready, within seconds, for what a non-blocking
      # call asked (:wait_readable or :wait_writable).
      def ready?(io, what, seconds)
        io = io.to_io
        seconds = [seconds, 0].max
        !!(what == :wait_writable ? IO.select(nil, [io], nil, seconds) : IO.select([io], nil, nil, seconds))
      end
    end

    # A final response: code (Integer), reason, headers ({"lowercase-name"
    # => [values]}) and body (a binary String once read; nil before).
    class Response
      attr_reader :code, :reason, :headers, :body

      def initialize(code, reason, headers, body)
        @code = code
        @reason = reason
        @headers = headers
        @reader = body
      end

      # A header's values as one ("a, b"); nil when there is none.
      def [](name)
        @headers[name.downcase]&.join(", ")
      end

      # The body's length by its Content-Length; nil when it is chunked,
      # goes to the end of the connection or there is no body (a HEAD
      # request's response: its Content-Length is in headers). Raises Error
      # when the body's framing is malformed or unknown.
      def content_length
        @reader.length
      end

      # Whether the body is longer than the limit: what was read of it (all
      # of it that is kept or yielded) stops there.
      def truncated?
        @reader.truncated?
      end

      # Reads the body, yielding each part as it comes, or, without a
      # block, into #body. Once only.
      def read_body(&block)
        raise Error, "the body has been read" if @read

        @read = true
        return @reader.each(&block) if block

        @body = "".b
        @reader.each { |chunk| @body << chunk }
        @body
      end
    end

    # A response's body as it comes off the connection: by Transfer-Encoding
    # chunked, by Content-Length or up to the end of the connection, its
    # framing checked when first asked for (after the caller has seen the
    # status). At most limit bytes are yielded; once more are known to come,
    # nothing more is read (chunked trailers never are: the connection
    # closes).
    class Body
      def initialize(connection, headers, limit:, line_limit:, none: false)
        @connection = connection
        @headers = headers
        @limit = limit
        @line_limit = line_limit
        @none = none
        @size = 0
        @truncated = false
      end

      # Whether more than limit bytes came, or are to come by Content-Length.
      def truncated?
        @truncated || length.to_i > @limit
      end

      # The Content-Length, an Integer; nil without one or when chunked.
      def length
        framing
        @length
      end

      # Yields the body's parts as they come, up to limit bytes in all.
      def each(&block)
        case framing
        when :chunked then each_chunk(&block)
        when :length then each_of_length(&block)
        when :to_end then @connection.copy(@limit + 1) { |chunk| emit(chunk, &block) }
        end
        nil
      end

      private

      # :none, :chunked, :length or :to_end; sets @length.
      def framing
        @framing ||= if @none
                       :none
                     elsif (transfer = header("transfer-encoding").downcase) == "chunked"
                       :chunked
                     elsif !transfer.empty?
                       raise Error, "the server sent it with Transfer-Encoding #{transfer}"
                     elsif (@length = content_length)
                       :length
                     else
                       :to_end
                     end
      end

      # A header's values as one ("" when there is none).
      def header(name)
        @headers.fetch(name, []).join(", ").strip
      end

      # Content-Length as an Integer (nil when there is none); raises when
      # it is malformed (values that differ, not a number).
      def content_length
        values = @headers.fetch("content-length", []).flat_map { |v| v.split(",").map(&:strip) }.uniq
        return nil if values.empty?
        raise Error, "the server sent a malformed Content-Length" unless values.size == 1 && values[0].match?(/\A\d+\z/)

        values[0].to_i
      end

      # Content-Length bytes, or limit of them.
      def each_of_length(&block)
        want = [@length, @limit].min
        got = @connection.copy(want) { |chunk| emit(chunk, &block) }
        raise Error, "the connection closed after #{got} of #{@length} bytes" if got < want
      end

      # Chunks up to the last (size 0), or up to the limit.
      def each_chunk(&block)
        loop do
          line = @connection.line(@line_limit)
          digits = line && line[/\A\h{1,16}(?=[ \t;]|\z)/n]
          raise Error, "the server sent malformed chunked data" unless digits

          length = digits.to_i(16)
          return if length.zero?

          want = [length, @limit + 1 - @size].min
          got = @connection.copy(want) { |chunk| emit(chunk, &block) }
          raise Error, "the connection closed in the middle of a chunk" if got < want
          return if @truncated
          raise Error, "the server sent malformed chunked data" unless @connection.line(2) == ""
        end
      end

      # Yields what of chunk is within the limit.
      def emit(chunk)
        room = @limit - @size
        if chunk.bytesize > room
          @truncated = true
          chunk = chunk.byteslice(0, room)
        end
        @size += chunk.bytesize
        yield chunk unless chunk.empty?
      end
    end

    # A connection's bytes, buffered: each wait for the socket (plain or TLS)
    # ends at the deadline (Timeout), failures of the socket are Errors, and
    # at most one read's worth is buffered beyond what is asked for.
    class Connection
      def initialize(io, deadline, seconds)
        @io = io
        @deadline = deadline
        @unread = "the server did not take the request within #{seconds} s"
        @unanswered = "the server did not answer within #{seconds} s"
        @buffer = "".b
      end

      # Writes data, a String of any encoding, a slice at a time (the whole
      # is never copied).
      def write(data)
        offset = 0
        while offset < data.bytesize
          written = guard { @io.write_nonblock(data.byteslice(offset, IO_SIZE), exception: false) }
          next wait(written, @unread) if written.is_a?(Symbol)

          offset += written
        end
      end

      # The next line without its end (CRLF, or LF alone); nil when it is
      # longer than limit bytes with its end. Raises at the end of the
      # connection.
      def line(limit)
        until (at = @buffer.index("\n"))
          return nil if @buffer.bytesize >= limit
          raise Error, "the connection closed before the response was complete" unless fill
        end
        return nil if at + 1 > limit

        @buffer.slice!(0, at + 1).chomp
      end

      # Yields the next bytes as they come, up to count of them or the end
      # of the connection; returns how many came.
      def copy(count)
        copied = 0
        while copied < count && (!@buffer.empty? || fill)
          chunk = @buffer.bytesize > count - copied ? @buffer.slice!(0, count - copied) : @buffer
          @buffer = "".b if chunk.equal?(@buffer)
          copied += chunk.bytesize
          yield chunk
        end
        copied
      end

      private

      # Reads what has come into the buffer; false at the end of the
      # connection.
      def fill
        loop do
          raise Timeout, @unanswered if left <= 0

          data = guard { @io.read_nonblock(IO_SIZE, exception: false) }
          return false if data.nil?
          next wait(data, @unanswered) if data.is_a?(Symbol)

          @buffer << data
          return true
        end
      end

      # Waits until the socket is ready for what a non-blocking call asked
      # (:wait_readable or :wait_writable: over TLS a read may need either,
      # and so may a write).
      def wait(what, late)
        raise Timeout, late unless HTTPClient.ready?(@io, what, left)
      end

      def left
        @deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
      end

      # The block's value; what the socket raises, as an Error.
      def guard
        yield
      rescue SystemCallError => e
        raise Error, HTTPClient.system_reason(e)
      rescue IOError => e
        raise Error, e.message
      rescue *TLS.errors => e
        raise Error, "TLS error: #{TLS.reason(e)}"
      end
    end

    # The TLS side of https://: the server's certificate verified against
    # the system's certificate authorities (or a file of them) and for the
    # URL's host; the handshake, like everything else, within the deadline.
    # OpenSSL is loaded only here, when an https:// URL is used: loading it
    # is slow.
    class TLS
      IPV4 = /\A\d{1,3}(?:\.\d{1,3}){3}\z/

      class << self
        # What OpenSSL raises (nothing before it is loaded).
        def errors
          defined?(OpenSSL::OpenSSLError) ? [OpenSSL::OpenSSLError] : []
        end

        # OpenSSL's reason without the call and the connection's state.
        def reason(error)
          error.message.sub(/\A.*? state=[^:]*: /, "")
        end
      end

      # The context for host, set up now (its CA file read) to say what is
      # wrong with it before connecting. A name is sent (SNI) and checked in
      # the handshake; an IP address is not (RFC 6066), and is checked after.
      def initialize(host, ca_file)
        require "openssl"
        @host = host
        @name = host unless host.match?(IPV4) || host.include?(":")
        @context = OpenSSL::SSL::SSLContext.new
        @context.set_params(verify_mode: OpenSSL::SSL::VERIFY_PEER, verify_hostname: !@name.nil?,
                            **(ca_file ? { ca_file: ca_file } : {}))
        @context.setup
      rescue OpenSSL::OpenSSLError => e
        raise Error, "TLS setup failed: #{TLS.reason(e)}" unless ca_file

        reason = File.readable?(ca_file) ? TLS.reason(e) : "it cannot be read"
        raise Error, "cannot use the CA file #{ca_file}: #{reason}"
      end

      # An SSLSocket over socket once its handshake is done and the
      # certificate verified for the host; socket is closed on failure.
      def connect(socket, deadline, seconds)
        ssl = OpenSSL::SSL::SSLSocket.new(socket, @context)
        ssl.sync_close = true
        ssl.hostname = @name if @name
        handshake(ssl, deadline, seconds)
        verify(ssl)
        ssl
      rescue StandardError => e
        socket.close
        raise unless e.is_a?(OpenSSL::OpenSSLError)

        raise Error, "TLS error: #{TLS.reason(e)}"
      end

      private

      # The TLS handshake, each wait for the socket ending at the deadline
      # (ConnectTimeout); a certificate that did not verify is said so.
      def handshake(ssl, deadline, seconds)
        while (state = ssl.connect_nonblock(exception: false)).is_a?(Symbol)
          left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          raise ConnectTimeout, "no TLS connection within #{seconds} s" unless HTTPClient.ready?(ssl, state, left)
        end
      rescue OpenSSL::OpenSSLError => e
        reason = TLS.reason(e)
        raise Error, "TLS handshake failed: #{reason}" if ssl.verify_result == OpenSSL::X509::V_OK

        raise Error, "TLS certificate verification failed: #{reason[/certificate verify failed \((.*)\)/, 1] || reason}"
      end

      # The certificate is for the host (a name again, an IP address for
      # the first time).
      def verify(ssl)
        ssl.post_connection_check(@host)
      rescue OpenSSL::SSL::SSLError => e
        raise Error, "TLS certificate verification failed: #{e.message}"
      end
    end
  end
end
